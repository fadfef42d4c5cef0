-- The metadata each experiment's latest run was scored with: its sample row of unit 'metadata' names the dataset
-- identity (the warehouse's `experiment_metadata` view renders this file).
select l.experiment_id, l.run_id, m.dataset_id, m.dataset, m.split
from {{ ref('stg_latest_samples') }} l
join (select distinct dataset_id, dataset, split from {{ ref('stg_sample_metadata') }}) m
    on m.dataset_id = l.sample_key
where l.unit = 'metadata'
