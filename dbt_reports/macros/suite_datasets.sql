{#- The shipped suites' datasets (var `suite_datasets`, written by clipcache from tasks/suites/*.yaml and the
    clip_benchmark collections: tasks/report/suites.py) as a relation with one row per (suite, dataset, metric part):
    a main metric made of several metric rows (mean_recall@1: both directions' recall@1) has one row per part. -#}
{% macro _sql_text(value) -%}
{{ "null" if value is none else "'" ~ (value | string | replace("'", "''")) ~ "'" }}
{%- endmacro %}
{% macro suite_datasets_table() -%}
{%- set rows = var('suite_datasets') -%}
select * from (values
{%- for r in rows %}
    ({{ _sql_text(r.suite) }}, {{ r.position }}, {{ _sql_text(r.dataset) }}, {{ _sql_text(r.name) }}, {{ _sql_text(r.task) }},
     {{ _sql_text(r.main_metric) }}, {{ _sql_text(r.metric) }}, {{ r.k if r.k is not none else 'null' }}::integer,
     {{ r.chance if r.chance is not none else 'null' }}::double, {{ _sql_text(r.split) }}, {{ _sql_text(r.language) }},
     {{ _sql_text(r.tags) }}, {{ 'true' if r.runnable else 'false' }}){{ ',' if not loop.last }}
{%- endfor %}
{%- if not rows %}
    (null, null, null, null, null, null, null, null::integer, null::double, null, null, null, null)
{%- endif %}
) as t(suite, position, dataset, name, task, main_metric, metric, k, chance, split, language, tags, runnable)
{%- if not rows %}
where false
{%- endif %}
{%- endmacro %}
