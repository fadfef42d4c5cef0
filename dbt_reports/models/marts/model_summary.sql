-- Macro average of the main metric over the datasets each model checkpoint was evaluated on for each task (latest
-- reference runs): acc1, a probe's lp_acc1 and a clustering NMI are not averaged together.
select
    model_label,
    model,
    pretrained,
    checkpoint,
    precision,
    task,
    count(*) as n_datasets,
    avg(main_value) as macro_average,
    min(created_at) as oldest_result,
    max(created_at) as newest_result
from {{ ref('leaderboard') }}
group by all
