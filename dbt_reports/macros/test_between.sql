{#- Generic data test: every non-null value of `column_name` lies in [low, high] (an accuracy, a rate, an F1). -#}
{% test between(model, column_name, low, high) %}
select *
from {{ model }}
where {{ column_name }} < {{ low }} or {{ column_name }} > {{ high }}
{% endtest %}
