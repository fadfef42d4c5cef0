-- Each metric value next to the previous run's value of the same (model, dataset, split, language, task, metric, k).
-- `regressed` / `improved` use the metric's direction and the `regression_threshold` var.
with ordered as (
    select
        run_id,
        created_at,
        model,
        coalesce(pretrained, '') as pretrained,
        dataset,
        split,
        language,
        task,
        metric,
        k,
        value,
        higher_is_better,
        lag(value) over w as previous_value,
        lag(run_id) over w as previous_run_id
    from {{ ref('stg_metrics') }}
    window w as (
        partition by model, coalesce(pretrained, ''), dataset, split, language, task, metric, coalesce(k, -1)
        order by created_at, run_id
    )
)
select
    *,
    value - previous_value as delta,
    case
        when previous_value is null or value is null then false
        when higher_is_better then value - previous_value < -{{ var('regression_threshold') }}
        else value - previous_value > {{ var('regression_threshold') }}
    end as regressed,
    case
        when previous_value is null or value is null then false
        when higher_is_better then value - previous_value > {{ var('regression_threshold') }}
        else value - previous_value < -{{ var('regression_threshold') }}
    end as improved
from ordered
