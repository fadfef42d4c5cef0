-- One row per (image sample row, metadata field) of each experiment's latest run: the sample's outcome and the
-- field's code and label in the metadata the run was scored with (the warehouse's `sample_groups` view renders this
-- file: storage/sql_rules.py).
select s.experiment_id, s.run_id, e.dataset, e.split, s.sample_index, s.sample_key, s.target, s.prediction,
    s.correct1, s.correct5, m.field, m.code, m.label
from {{ ref('stg_latest_samples') }} s
join {{ ref('stg_experiment_metadata') }} e on e.experiment_id = s.experiment_id and e.run_id = s.run_id
join {{ ref('stg_sample_metadata') }} m on m.dataset_id = e.dataset_id and m.sample_key = s.sample_key
where s.unit = 'image'
