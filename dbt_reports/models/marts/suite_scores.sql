-- Per suite and model (model, checkpoint, precision) with a result on at least one of the suite's datasets: the
-- suite score = mean of the main metrics over EVERY dataset of the suite, and the normalised score = mean of
-- (value - chance) / (1 - chance): the one definition, which `clipcache suite score` and the warehouse's
-- `suite_scores` view render (storage/sql_rules.py). A model missing a dataset is partial: score and normalized are null, `coverage` says
-- 'partial: <present> of <datasets>', `missing` lists the datasets, and the mean over the present ones is in
-- partial_score / partial_normalized only, never in score. Intervals and ranks (a bootstrap over the per-sample
-- rows) are in `suite_intervals`, written beside these marts by `clipcache report` (tasks/report/suites.py).
with members as (
    select suite, dataset, split, language, min(position) as position, any_value(name) as name
    from {{ ref('stg_suite_datasets') }}
    group by suite, dataset, split, language
),
sizes as (
    select suite, count(*) as n_datasets from members group by suite
),
models as (
    select distinct suite, model, pretrained, checkpoint, precision from {{ ref('suite_results') }}
),
coverage as (
    select
        mo.suite, mo.model, mo.pretrained, mo.checkpoint, mo.precision,
        count(r.value) as n_present,
        avg(r.value) as mean_present,
        avg(r.normalized) as normalized_present,
        count(r.normalized) as n_normalized,
        list(m.dataset order by m.position) filter (where r.value is null) as missing
    from models mo
    join members m on m.suite = mo.suite
    left join {{ ref('suite_results') }} r
        on r.suite = mo.suite and r.dataset = m.dataset and r.split = m.split and r.language = m.language
        and r.model = mo.model and r.pretrained is not distinct from mo.pretrained
        and r.checkpoint is not distinct from mo.checkpoint and r.precision is not distinct from mo.precision
    group by all
)
select
    c.suite,
    c.model,
    c.pretrained,
    c.checkpoint,
    c.precision,
    c.model || coalesce(' @ ' || c.pretrained, '')
        || case when c.precision is null or c.precision = 'fp32' then '' else ' (' || c.precision || ')' end
        as model_label,
    c.n_present as datasets_present,
    s.n_datasets as datasets,
    c.n_present = s.n_datasets as complete,
    case when c.n_present = s.n_datasets then 'complete'
         else 'partial: ' || c.n_present || ' of ' || s.n_datasets end as coverage,
    case when c.n_present = s.n_datasets then c.mean_present end as score,
    case when c.n_present = s.n_datasets and c.n_normalized = c.n_present then c.normalized_present end
        as normalized,
    case when c.n_present < s.n_datasets then c.mean_present end as partial_score,
    case when c.n_present < s.n_datasets and c.n_normalized = c.n_present then c.normalized_present end
        as partial_normalized,
    coalesce(c.missing, []::varchar[]) as missing
from coverage c
join sizes s using (suite)
