{#- Generic data test: `column_name` is null on every row where `condition` does not hold (a suite score is never
    given for a partial suite). -#}
{% test null_unless(model, column_name, condition) %}
select *
from {{ model }}
where {{ column_name }} is not null and not ({{ condition }})
{% endtest %}
