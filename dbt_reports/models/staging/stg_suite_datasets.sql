-- One row per (suite, dataset, metric part) of every shipped suite (tasks/suites/): the same rows as the warehouse's
-- `suite_datasets` table (tasks/suites/sql.py), plus the dataset's position in its suite. `clipcache report` passes
-- them as the var `suite_datasets`; dbt run by hand without it sees no suite.
select
    suite,
    position::integer as position,
    dataset,
    name,
    task,
    main_metric,
    metric,
    k,
    chance,
    split,
    language,
    tags,
    runnable::boolean as runnable
from ({{ suite_datasets_table() }})
