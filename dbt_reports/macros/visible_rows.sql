{#- The rows queries should see: those of files not absorbed by a compacted file (storage/compaction.py).
    `relation` is read with read_parquet(..., filename = true); every file has the column source_file. -#}
{% macro visible_rows(relation) -%}
with files as (select * from {{ relation }})
select * exclude (filename, source_file)
from files
where parse_filename(filename) not in (select source_file from files where source_file is not null)
{%- endmacro %}
