{#- Generic data test: every value of `column_name` is a task clipcache registers (var `tasks`, written by clipcache
    from its task registry, so a new task never needs an edit here). -#}
{% test accepted_tasks(model, column_name) %}
select {{ column_name }}, count(*) as n
from {{ model }}
where {{ column_name }} not in ({% for t in var('tasks') %}'{{ t }}'{{ ',' if not loop.last }}{% endfor %})
group by all
{% endtest %}
