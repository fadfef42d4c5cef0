-- One row per (model, checkpoint, dataset, split, language, task, precision) of the latest reference runs, with the
-- task's main metric. Each task declares its main metric (clipcache.tasks.evaluation; passed in as the var
-- `main_metrics`): the rows of the lowest priority present are averaged, e.g. classification: acc1, else
-- mean_average_precision for multilabel datasets; retrieval: the mean of image and text recall@5.
-- ci_low / ci_high: the main metric's 95% interval where it is one metric row that has one (an average of two
-- metrics has none: the mean of two intervals is not the interval of the mean).
with main_metrics as (
    {{ main_metrics_table() }}
),
candidates as (
    select
        m.model, m.pretrained, m.checkpoint, m.dataset, m.split, m.language, m.task, m.precision,
        m.run_id, m.created_at, m.n_samples, m.experiment_id, mm.label, mm.priority, m.value, m.ci_low, m.ci_high
    from {{ ref('latest_metrics') }} m
    join main_metrics mm
        on m.task = mm.task and m.metric = mm.metric and coalesce(m.k, -1) = coalesce(mm.k, -1)
),
chosen as (
    select *, min(priority) over (partition by model, checkpoint, dataset, split, language, task, precision) as best
    from candidates
)
select
    model,
    max(pretrained) as pretrained,
    model || coalesce(' @ ' || max(pretrained), '') || case when precision = 'fp32' then '' else ' (' || precision || ')' end
        as model_label,
    checkpoint,
    dataset,
    -- the report's column: one per dataset, split and language (en and cn results of one model are two cells)
    dataset || case when split <> 'test' then ' (' || split || ')' else '' end
        || case when language <> 'en' then ' [' || language || ']' else '' end as dataset_label,
    split,
    language,
    task,
    precision,
    max(run_id) as run_id,
    max(created_at) as created_at,
    max(n_samples) as n_samples,
    max(label) as main_metric,
    avg(value) as main_value,
    case when count(*) = 1 then max(ci_low) end as ci_low,
    case when count(*) = 1 then max(ci_high) end as ci_high
from chosen
where priority = best
group by model, checkpoint, dataset, split, language, task, precision
