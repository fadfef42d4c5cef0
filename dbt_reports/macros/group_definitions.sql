{#- DataComp's group metrics (var `group_definitions`: one row per dataset and metric, with its statistic and
    the metadata field it groups by) and the FairFace / UTKFace head metrics (var `face_definitions`), as
    relations. `clipcache report` writes both from tasks/datasets/datacomp/group_layouts.json (tasks/suites/groups.py
    dbt_vars); the same rows as the warehouse's `group_definitions` / `face_definitions` tables. -#}
{% macro _sql_number(value) -%}
{{ "null" if value is none else value }}
{%- endmacro %}
{% macro group_definitions_table() -%}
{%- set rows = var('group_definitions') -%}
select * from (values
{%- for r in rows %}
    ({{ _sql_text(r.dataset) }}, {{ _sql_text(r.metric) }}, {{ _sql_text(r.statistic) }}, {{ _sql_text(r.field) }}){{ ',' if not loop.last }}
{%- endfor %}
{%- if not rows %}
    (null, null, null, null)
{%- endif %}
) as t(dataset, metric, statistic, field)
{%- if not rows %}
where false
{%- endif %}
{%- endmacro %}
{% macro face_definitions_table() -%}
{%- set rows = var('face_definitions') -%}
select dataset::varchar as dataset, metric::varchar as metric, head::varchar as head, rule::varchar as rule,
    class_code::bigint as class_code, low::bigint as low, high::bigint as high, truth::varchar as truth,
    by1::varchar as by1, by2::varchar as by2
from (values
{%- for r in rows %}
    ({{ _sql_text(r.dataset) }}, {{ _sql_text(r.metric) }}, {{ _sql_text(r.head) }}, {{ _sql_text(r.rule) }},
     {{ _sql_number(r.class_code) }}, {{ _sql_number(r.low) }}, {{ _sql_number(r.high) }}, {{ _sql_text(r.truth) }},
     {{ _sql_text(r.by1) }}, {{ _sql_text(r.by2) }}){{ ',' if not loop.last }}
{%- endfor %}
{%- if not rows %}
    (null, null, null, null, null, null, null, null, null, null)
{%- endif %}
) as t(dataset, metric, head, rule, class_code, low, high, truth, by1, by2)
{%- if not rows %}
where false
{%- endif %}
{%- endmacro %}
