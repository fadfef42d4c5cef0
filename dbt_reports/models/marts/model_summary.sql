-- Macro average of the main metric over the datasets each model checkpoint was evaluated on (latest reference runs).
select
    model_label,
    model,
    pretrained,
    checkpoint,
    precision,
    count(*) as n_datasets,
    avg(main_value) as macro_average,
    min(created_at) as oldest_result,
    max(created_at) as newest_result
from {{ ref('leaderboard') }}
group by all
