-- DataComp's group metrics per dataset: (dataset, metric, statistic, field), var `group_definitions`.
{{ group_definitions_table() }}
