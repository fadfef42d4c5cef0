-- Each model's main metric per suite dataset, from the leaderboard's rows (latest_metrics: the latest full-data,
-- default-prompt run): a main metric made of several metric rows (mean_recall@K) is their mean, and counts only
-- when every part is present and all parts come from one experiment. The one definition: the warehouse's
-- `suite_results` view and `clipcache suite score` render this file (storage/sql_rules.py). normalized: (value - chance) / (1 - chance), null without a chance score.
with parts as (
    select *, count(*) over (partition by suite, dataset, split, language) as n_parts
    from {{ ref('stg_suite_datasets') }}
),
matched as (
    select
        p.suite, p.position, p.dataset, p.name, p.split, p.language, p.main_metric, p.chance, p.n_parts,
        l.model, l.pretrained, l.checkpoint, l.precision, l.value, l.experiment_id, l.run_id, l.created_at
    from parts p
    join {{ ref('latest_metrics') }} l
        on l.dataset = p.dataset and l.split = p.split and l.language = p.language and l.metric = p.metric
        and l.k is not distinct from p.k and (p.task = 'auto' or l.task = p.task)
    where l.value is not null
)
select
    suite,
    position,
    dataset,
    name,
    split,
    language,
    main_metric,
    chance,
    model,
    pretrained,
    checkpoint,
    precision,
    avg(value) as value,
    (avg(value) - chance) / (1 - chance) as normalized,
    min(experiment_id) as experiment_id,
    max(run_id) as run_id,
    max(created_at) as created_at
from matched
group by suite, position, dataset, name, split, language, main_metric, chance, model, pretrained, checkpoint,
    precision
having count(*) = min(n_parts) and count(distinct experiment_id) = 1
