-- The sample rows of each experiment's latest completed run (the warehouse's `latest_samples` view), with the
-- columns the group marts read: visible rows (not absorbed by compaction) of completed runs, the latest run per
-- experiment. A warehouse without sample files (older than them) gives an empty relation of the same columns.
-- depends_on: {{ ref('stg_runs') }}
{%- set samples = source('warehouse', 'samples') %}
{%- if warehouse_has('samples') %}
with rows as (
    {{ visible_rows(samples) }}
),
typed as (
    select * from rows
    -- columns no file has yet read as typed nulls (as the warehouse's views read them)
    union all by name
    select null::varchar as sample_key, null::bigint as target, null::bigint as prediction,
        null::boolean as correct1, null::boolean as correct5
    where false
)
select run_id, created_at, experiment_id, task, unit, sample_index, sample_key, target, prediction, correct1,
    correct5
from typed
semi join (select run_id from {{ ref('stg_runs') }} where status = 'completed') using (run_id)
qualify dense_rank() over (partition by experiment_id order by created_at desc, run_id desc) = 1
{%- else %}
select null::varchar as run_id, null::timestamptz as created_at, null::varchar as experiment_id,
    null::varchar as task, null::varchar as unit, null::bigint as sample_index, null::varchar as sample_key,
    null::bigint as target, null::bigint as prediction, null::boolean as correct1, null::boolean as correct5
where false
{%- endif %}
