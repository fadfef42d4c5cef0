-- Per-sample metadata (storage/sample_metadata.py): one row per (dataset identity, sample, field); empty and typed
-- when the warehouse has no metadata file (no dataset with groups evaluated yet).
{%- set metadata = source('warehouse', 'sample_metadata') %}
{%- if warehouse_has('sample_metadata') %}
select dataset_id, dataset, split, layout, sample_index, sample_key, field, code, label
from {{ metadata }}
{%- else %}
select null::varchar as dataset_id, null::varchar as dataset, null::varchar as split, null::varchar as layout,
    null::bigint as sample_index, null::varchar as sample_key, null::varchar as field, null::bigint as code,
    null::varchar as label
where false
{%- endif %}
