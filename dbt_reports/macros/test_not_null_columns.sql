{#- Generic data test: none of `columns` is null on any row. The built-in not_null for several columns of one model
    in one query (one test node instead of one per column: each node costs dbt a compile and a round trip). -#}
{% test not_null_columns(model, columns) %}
select *
from {{ model }}
where {% for c in columns %}{{ c }} is null{{ ' or ' if not loop.last }}{% endfor %}
{% endtest %}
