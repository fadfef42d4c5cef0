-- The sample rows queries count (the warehouse's `samples` view): visible rows (not absorbed by compaction) of
-- completed runs, with every column of the sample files (storage/results.py SAMPLE_SCHEMA), in its order. Columns
-- no file has yet (files of an older release) read as typed nulls, as the warehouse's views read them; a warehouse
-- without sample files (older than them) gives an empty relation of the same columns.
-- depends_on: {{ ref('stg_runs') }}
with typed as (
    select null::varchar as run_id, null::timestamptz as created_at, null::varchar as experiment_id,
        null::varchar as task, null::varchar as unit, null::bigint as sample_index, null::varchar as sample_key,
        null::bigint as target, null::bigint as prediction, null::integer[] as top, null::boolean as correct1,
        null::boolean as correct5, null::bigint as rank, null::boolean as tied, null::double as score,
        null::double as margin, null::double as value, null::integer as schema_version,
        null::integer[] as hits_at, null::varchar as caption, null::varchar[] as reference_captions
    where false
{%- if warehouse_has('samples') %}
    union all by name
    select * from (
        {{ visible_rows(source('warehouse', 'samples')) }}
    )
{%- endif %}
)
select typed.*
from typed
semi join (select run_id from {{ ref('stg_runs') }} where status = 'completed') using (run_id)
