-- Per experiment, DataComp's group metrics by name (metric, value, groups: the groups or classes it is taken over):
-- worst-group top-1 / top-5 accuracy (acc_wg, acc_worst_region, acc_worst_year, acc_top5_wg: the lowest accuracy
-- over the field's groups with samples), WILDS' macro F1 (F1-macro_all: the mean over the classes present in the
-- targets of 2 tp / (predicted + support)), and the FairFace / UTKFace head metrics (<metric>_avg, per group,
-- <metric>_wg: face_metrics). The warehouse's `group_metrics` view renders this file (storage/sql_rules.py); the
-- evaluation's metric rows hold the same numbers (NumPy, tasks/suites/groups.py), with bootstrap intervals.
with worst as (
    select g.experiment_id, g.dataset, g.split, d.metric,
        case d.statistic when 'worst_acc1' then min(g.acc1) else min(g.acc5) end as value,
        count(*) as groups
    from {{ ref('group_accuracy') }} g
    join {{ ref('stg_group_definitions') }} d on d.dataset = g.dataset and d.field = g.field
    where d.statistic in ('worst_acc1', 'worst_acc5')
    group by g.experiment_id, g.dataset, g.split, d.metric, d.statistic
    -- top-5 accuracy is not defined with fewer than 5 classes: no row
    having count(case d.statistic when 'worst_acc1' then g.acc1 else g.acc5 end) > 0
),
images as (
    select e.experiment_id, e.dataset, e.split, s.target, s.prediction
    from {{ ref('stg_latest_samples') }} s
    join {{ ref('stg_experiment_metadata') }} e on e.experiment_id = s.experiment_id and e.run_id = s.run_id
    where s.unit = 'image'
),
classes as (
    select experiment_id, dataset, split, target as class, count(*) as support,
        count(*) filter (where prediction = target) as tp
    from images
    group by experiment_id, dataset, split, target
),
predicted as (
    select experiment_id, prediction as class, count(*) as predicted
    from images
    group by experiment_id, prediction
),
f1 as (
    select c.experiment_id, c.dataset, c.split, d.metric,
        avg(2.0 * c.tp / (coalesce(p.predicted, 0) + c.support)) as value,
        count(*) as groups
    from classes c
    join {{ ref('stg_group_definitions') }} d on d.dataset = c.dataset and d.statistic = 'macro_f1'
    left join predicted p on p.experiment_id = c.experiment_id and p.class = c.class
    group by c.experiment_id, c.dataset, c.split, d.metric
),
found as (
    select * from worst
    union all
    select * from f1
    union all
    select * from {{ ref('face_metrics') }}
)
select f.experiment_id, x.model, x.pretrained, x.checkpoint, x.precision, f.dataset, f.split, f.metric, f.value,
    f.groups
from found f
left join {{ ref('stg_experiment_models') }} x using (experiment_id)
