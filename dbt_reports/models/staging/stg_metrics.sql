-- The metric rows queries count: visible (not absorbed by compaction) and of completed runs only, the same rule as
-- the warehouse's `metrics` view (storage/warehouse.py). Rows of failed or killed runs never reach the marts.
with rows as (
    {{ visible_rows(source('warehouse', 'metrics')) }}
)
select rows.*
from rows
semi join (select run_id from {{ ref('stg_runs') }} where status = 'completed') using (run_id)
