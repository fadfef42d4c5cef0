-- Each metric value next to the previous run's value of the same experiment (experiment_id: model, checkpoint,
-- dataset, split, language, task, precision, limit, prompts and task settings) and metric / k, so a limited run or a
-- what-if is compared only with runs like it. `regressed` / `improved` use the metric's direction and the
-- `regression_threshold` var.
with ordered as (
    select
        run_id,
        created_at,
        experiment_id,
        model,
        pretrained,
        checkpoint,
        dataset,
        split,
        language,
        task,
        precision,
        metric,
        k,
        value,
        higher_is_better,
        lag(value) over w as previous_value,
        lag(run_id) over w as previous_run_id
    from {{ ref('stg_metrics') }}
    window w as (
        partition by experiment_id, metric, coalesce(k, -1)
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
