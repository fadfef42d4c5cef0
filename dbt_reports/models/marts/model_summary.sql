-- Macro average of the main metric over the datasets each model was evaluated on (latest runs).
select
    model,
    pretrained,
    count(*) as n_datasets,
    avg(main_value) as macro_average,
    min(created_at) as oldest_result,
    max(created_at) as newest_result
from {{ ref('leaderboard') }}
group by all
