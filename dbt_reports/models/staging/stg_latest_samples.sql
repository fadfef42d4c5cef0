-- The rule of the latest sample rows: per experiment, the sample rows of its latest completed run (the latest
-- created_at; run_id breaks a tie), with every column of stg_samples. Written once: dbt builds it over its staging
-- model, and the warehouse's `latest_samples` view is this file rendered over its `samples` view
-- (storage/sql_rules.py), which `sample_flips`, `caption_pairs`, `clipcache compare` and the compare pages read.
select *
from {{ ref('stg_samples') }}
qualify dense_rank() over (partition by experiment_id order by created_at desc, run_id desc) = 1
