-- The metric rows queries count: visible (not absorbed by compaction) and of completed runs only, the same rule as
-- the warehouse's `metrics` view (storage/warehouse.py). Rows of failed or killed runs never reach the marts.
with rows as (
    {{ visible_rows(source('warehouse', 'metrics')) }}
)
select rows.*
from rows
semi join (select run_id from {{ ref('stg_runs') }} where status = 'completed') using (run_id)
-- ci_low / ci_high were added to schema 2 as nullable columns: a warehouse whose files all predate them reads them
-- as nulls (UNION BY NAME adds the columns the files lack, and keeps those they have)
union all by name
select null::double as ci_low, null::double as ci_high
where false
