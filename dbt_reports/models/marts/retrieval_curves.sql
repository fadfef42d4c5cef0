-- recall@k by k for the latest reference retrieval runs: one curve per (model checkpoint, dataset, split, language,
-- direction).
select
    model || coalesce(' @ ' || pretrained, '') || case when precision = 'fp32' then '' else ' (' || precision || ')' end
        as model_label,
    model,
    checkpoint,
    dataset,
    dataset || case when split <> 'test' then ' (' || split || ')' else '' end
        || case when language <> 'en' then ' [' || language || ']' else '' end as dataset_label,
    split,
    language,
    case metric when 'image_retrieval_recall' then 'text->image' else 'image->text' end as direction,
    k,
    value
from {{ ref('latest_metrics') }}
where metric in ('image_retrieval_recall', 'text_retrieval_recall')
