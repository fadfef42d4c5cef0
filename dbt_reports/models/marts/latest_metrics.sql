-- The leaderboard's rows: per (model, checkpoint, dataset, split, language, task, precision) the latest completed
-- reference run (full data, the dataset's own prompts, default task settings). The warehouse's `leaderboard` view
-- renders this file (storage/sql_rules.py). Limited runs and what-ifs stay in stg_metrics and never get here; the one
-- option a reference run may carry is mteb_roles (storage/experiment.py: REFERENCE_OPTIONS).
with reference as (
    select *
    from {{ ref('stg_metrics') }}
    where sample_limit is null and default_prompts and task_options in ('{}', '{"mteb_roles":"query-document"}')
),
ranked as (
    select
        *,
        dense_rank() over (
            partition by model, checkpoint, dataset, split, language, task, precision
            order by created_at desc, run_id desc
        ) as recency
    from reference
)
select * exclude (recency)
from ranked
where recency = 1
