-- Per experiment, FairFace / UTKFace metric and group of its `by` fields: DataComp's name for the group's value
-- (`<metric>_<field>:<code>`, two fields last field first: `acc_gender_x_race:3_gender:1`), the group's faces (n)
-- and the mean outcome. The warehouse's `face_group_metrics` view renders this file (storage/sql_rules.py).
select
    experiment_id, dataset, split, metric, by1, code1, by2, code2,
    metric || '_' || case when by2 is null then by1 || ':' || code1
                          else by2 || ':' || code2 || '_' || by1 || ':' || code1 end as name,
    count(*) as n,
    avg(outcome) as value
from {{ ref('stg_face_outcomes') }}
group by experiment_id, dataset, split, metric, by1, code1, by2, code2
