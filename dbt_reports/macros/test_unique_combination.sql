{#- Generic data test: no two rows share the same values in `columns` (nulls compared as equal). A stand-in for
    dbt_utils.unique_combination_of_columns, which cannot be installed offline. -#}
{% test unique_combination(model, columns) %}
select {{ columns | join(', ') }}, count(*) as n
from {{ model }}
group by all
having count(*) > 1
{% endtest %}
