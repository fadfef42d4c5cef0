-- Per experiment, metadata field and group (code): the group's images (n), top-1 and top-5 accuracy, for every
-- experiment whose latest run was scored with per-sample metadata (WILDS, Dollar Street, GeoDE). A group without
-- samples has no row; model columns from the experiment's metric rows. The warehouse's `group_accuracy` view
-- renders this file (storage/sql_rules.py).
select
    g.experiment_id, x.model, x.pretrained, x.checkpoint, x.precision, g.dataset, g.split, g.field, g.code,
    any_value(g.label) as label,
    count(*) as n,
    avg(cast(g.correct1 as double)) as acc1,
    avg(cast(g.correct5 as double)) as acc5
from {{ ref('stg_sample_groups') }} g
left join {{ ref('stg_experiment_models') }} x using (experiment_id)
group by g.experiment_id, x.model, x.pretrained, x.checkpoint, x.precision, g.dataset, g.split, g.field, g.code
