-- Per experiment, its model columns (model, pretrained, checkpoint, precision) from its metric rows: what the group
-- marts show beside an experiment id (the warehouse's `experiment_models` view renders this file).
select experiment_id, any_value(model) as model, any_value(pretrained) as pretrained,
    any_value(checkpoint) as checkpoint, any_value(precision) as precision
from {{ ref('stg_metrics') }}
group by experiment_id
