{#- Whether the warehouse holds any Parquet file of `table` (a folder written only since some release, or only
    by some tasks: samples, sample_metadata). A model over such a table reads it when it does and is an empty,
    typed relation when it does not, so a warehouse without the folder still builds. Decided when the model runs
    (false while dbt parses, when no query can run). -#}
{% macro warehouse_has(table) -%}
{%- if execute -%}
    {%- set pattern = env_var('CLIPCACHE_WAREHOUSE', '../outputs/warehouse') ~ '/' ~ table ~ '/*.parquet' -%}
    {%- set found = run_query("select count(*) from glob('" ~ (pattern | replace("'", "''")) ~ "')") -%}
    {{ return(found.columns[0].values()[0] > 0) }}
{%- endif -%}
{{ return(false) }}
{%- endmacro %}
