-- One row per (model, dataset) of the latest runs with the task's main metric:
--   classification: acc1 (mean_average_precision for multilabel datasets, which have no acc rows)
--   retrieval: mean of image_retrieval_recall@5 and text_retrieval_recall@5
with per_pair as (
    select
        model,
        coalesce(pretrained, '') as pretrained,
        dataset,
        split,
        language,
        task,
        max(run_id) as run_id,
        max(created_at) as created_at,
        max(n_samples) as n_samples,
        max(case when metric = 'acc' and k = 1 then value end) as acc1,
        max(case when metric = 'mean_average_precision' then value end) as map,
        avg(case when metric in ('image_retrieval_recall', 'text_retrieval_recall') and k = 5 then value end)
            as recall5
    from {{ ref('latest_metrics') }}
    group by all
)
select
    model,
    pretrained,
    dataset,
    split,
    language,
    task,
    run_id,
    created_at,
    n_samples,
    case
        when task = 'zeroshot_retrieval' then 'mean_retrieval_recall@5'
        when acc1 is not null then 'acc1'
        else 'mean_average_precision'
    end as main_metric,
    case
        when task = 'zeroshot_retrieval' then recall5
        else coalesce(acc1, map)
    end as main_value
from per_pair
