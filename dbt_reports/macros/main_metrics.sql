{#- The tasks' main metrics (var `main_metrics`, written by clipcache from its task registry) as a relation with
    columns task, metric, k, label, priority. -#}
{% macro main_metrics_table() -%}
select * from (values
{%- for m in var('main_metrics') %}
    ('{{ m.task }}', '{{ m.metric }}', {{ m.k if m.k is not none else 'null' }}::integer, '{{ m.label }}', {{ m.priority }}){{ ',' if not loop.last }}
{%- endfor %}
) as t(task, metric, k, label, priority)
{%- endmacro %}
