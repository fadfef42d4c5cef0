-- recall@k by k for the latest retrieval runs: one curve per (model, dataset, direction).
select
    model,
    coalesce(pretrained, '') as pretrained,
    dataset,
    case metric when 'image_retrieval_recall' then 'text->image' else 'image->text' end as direction,
    k,
    value
from {{ ref('latest_metrics') }}
where metric in ('image_retrieval_recall', 'text_retrieval_recall')
