{#- Generic data test: `column_name` is a key: never null, no value twice. The built-in not_null and unique in one
    query (one test node instead of two). -#}
{% test unique_not_null(model, column_name) %}
select {{ column_name }}, count(*) as n
from {{ model }}
group by {{ column_name }}
having {{ column_name }} is null or count(*) > 1
{% endtest %}
