-- Per experiment, every FairFace / UTKFace metric by DataComp's name (metric, value, groups): `<metric>_avg`, the
-- mean outcome over all faces; `<metric>_<group>`, each group's mean (face_group_metrics); `<metric>_wg`, the lowest
-- of those (WILDS' worst group, over the groups with faces). The warehouse's `face_metrics` view renders this file.
with per_group as (
    select experiment_id, dataset, split, metric, count(*) as groups, min(value) as worst
    from {{ ref('face_group_metrics') }}
    group by experiment_id, dataset, split, metric
)
select o.experiment_id, o.dataset, o.split, o.metric || '_avg' as metric, avg(o.outcome) as value,
    any_value(p.groups) as groups
from {{ ref('stg_face_outcomes') }} o
join per_group p using (experiment_id, dataset, split, metric)
group by o.experiment_id, o.dataset, o.split, o.metric
union all
select experiment_id, dataset, split, name, value, 1 from {{ ref('face_group_metrics') }}
union all
select experiment_id, dataset, split, metric || '_wg', worst, groups from per_group
