-- Per (experiment, face metric, face): the head's prediction, the 0/1 outcome of the metric's rule and the face's
-- group codes (the warehouse's `face_outcomes` view renders this file).
select
    s.experiment_id, s.run_id, e.dataset, e.split, d.metric, s.sample_index, s.sample_key, s.prediction,
    cast(case d.rule
        when 'equals' then s.prediction = t.code
        when 'not_class' then cast(s.prediction <> d.class_code as bigint) = t.code
        when 'range' then s.prediction >= d.low and (d.high is null or s.prediction < d.high)
    end as double) as outcome,
    d.by1, g1.code as code1, d.by2, g2.code as code2
from {{ ref('stg_latest_samples') }} s
join {{ ref('stg_experiment_metadata') }} e on e.experiment_id = s.experiment_id and e.run_id = s.run_id
join {{ ref('stg_face_definitions') }} d on d.dataset = e.dataset and s.unit = 'face_' || d.head
left join {{ ref('stg_sample_metadata') }} t
    on t.dataset_id = e.dataset_id and t.sample_index = s.sample_index and t.field = d.truth
join {{ ref('stg_sample_metadata') }} g1
    on g1.dataset_id = e.dataset_id and g1.sample_index = s.sample_index and g1.field = d.by1
left join {{ ref('stg_sample_metadata') }} g2
    on g2.dataset_id = e.dataset_id and g2.sample_index = s.sample_index and g2.field = d.by2
