-- The rows of the most recent run of each (model, pretrained, dataset, split, language, task).
with ranked as (
    select
        *,
        dense_rank() over (
            partition by model, coalesce(pretrained, ''), dataset, split, language, task
            order by created_at desc, run_id desc
        ) as recency
    from {{ ref('stg_metrics') }}
)
select * exclude (recency)
from ranked
where recency = 1
