"""Each flow run publishes Prefect artifacts: a metrics table and a markdown summary linking its result files."""

from __future__ import annotations

import json


def read_artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_evaluate_publishes_a_metrics_table_and_a_summary(prefect_server, tmp_path):
    from clipcache.flows.evaluate import evaluate
    from clipcache.flows.params import EvaluateParams

    [result] = evaluate(EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=["shapes"], limit=20,
                                       output_dir=str(tmp_path / "o"), cache_dir=str(tmp_path / "c"), verbose=False))
    tables = [a for a in read_artifacts("evaluate-metrics") if result.run_id in (a.description or "")]
    assert len(tables) == 1 and tables[0].type == "table"
    rows = tables[0].data if isinstance(tables[0].data, list) else json.loads(tables[0].data)
    assert {r["metric"] for r in rows} == {"acc1", "acc5", "mean_per_class_recall"}
    summaries = [a for a in read_artifacts("evaluate-summary") if result.run_id in str(a.data)]
    assert len(summaries) == 1 and "shapes_zeroshot_classification.limit20.json" in str(summaries[0].data)
