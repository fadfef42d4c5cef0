-- Per experiment, metadata field and group (code): the group's images (n), top-1 and top-5 accuracy, for every
-- experiment whose latest run was scored with per-sample metadata (WILDS, Dollar Street, GeoDE). A group without
-- samples has no row. The same rows as the warehouse's `group_accuracy` view (tasks/suites/groups.py); model
-- columns added from the experiment's metric rows.
with sample_groups as (
    select s.experiment_id, e.dataset, e.split, s.correct1, s.correct5, m.field, m.code, m.label
    from {{ ref('stg_latest_samples') }} s
    join {{ ref('stg_experiment_metadata') }} e on e.experiment_id = s.experiment_id and e.run_id = s.run_id
    join {{ ref('stg_sample_metadata') }} m on m.dataset_id = e.dataset_id and m.sample_key = s.sample_key
    where s.unit = 'image'
),
experiments as (
    select experiment_id, any_value(model) as model, any_value(pretrained) as pretrained,
        any_value(checkpoint) as checkpoint, any_value(precision) as precision
    from {{ ref('stg_metrics') }}
    group by experiment_id
)
select
    g.experiment_id, x.model, x.pretrained, x.checkpoint, x.precision, g.dataset, g.split, g.field, g.code,
    any_value(g.label) as label,
    count(*) as n,
    avg(cast(g.correct1 as double)) as acc1,
    avg(cast(g.correct5 as double)) as acc5
from sample_groups g
left join experiments x using (experiment_id)
group by g.experiment_id, x.model, x.pretrained, x.checkpoint, x.precision, g.dataset, g.split, g.field, g.code
