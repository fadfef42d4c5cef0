"""Each flow run publishes Prefect artifacts: a metrics table and a markdown summary linking its result files."""

from __future__ import annotations

import json
import time


def read_artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_evaluate_publishes_a_metrics_table_and_a_summary(prefect_server, tmp_path):
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    [result] = evaluate(EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=["shapes"], limit=20,
                                       output_dir=str(tmp_path / "o"), cache_dir=str(tmp_path / "c"), verbose=False))
    tables = [a for a in read_artifacts("evaluate-metrics") if result.run_id in (a.description or "")]
    assert len(tables) == 1 and tables[0].type == "table"
    rows = tables[0].data if isinstance(tables[0].data, list) else json.loads(tables[0].data)
    assert {r["metric"] for r in rows} == {"acc1", "acc5", "mean_per_class_recall"}
    from clipcache.flows.orchestration.summary import format_value

    # the same cells as the CLI table: 4 decimals, the same cache words
    assert {r["metric"]: r["value"] for r in rows} == {k: format_value(v) for k, v in result.metrics.items()}
    assert {r["cache"] for r in rows} == {"encoded"} and {r["n"] for r in rows} == {20}
    summaries = [a for a in read_artifacts("evaluate-summary") if result.run_id in str(a.data)]
    assert len(summaries) == 1 and "shapes_zeroshot_classification.limit20.json" in str(summaries[0].data)


def test_clipcache_log_lines_reach_the_runs_logs_with_tasks_named_by_model_and_dataset(prefect_server, tmp_path):
    """What an operator sees in the Prefect UI: clipcache's own lines in the flow run's logs (in any process a flow
    runs in, not only the CLI's), and task runs named with the stage, the model and the dataset."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.logging.handlers import APILogHandler

    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import rescore
    from clipcache.flows.orchestration.pipeline import run_evaluation
    from clipcache.flows.orchestration.stages import LocalStages

    params = EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=["shapes"], limit=20,
                            output_dir=str(tmp_path / "o"), cache_dir=str(tmp_path / "c"), verbose=False)
    run_evaluation(params, LocalStages(), cached_only=False)  # fill the cache without Prefect
    [result] = rescore(params)
    APILogHandler().flush()  # logs are shipped in batches
    with get_client(sync_client=True) as client:
        [run] = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["rescore-shapes"])),
                                      sort=FlowRunSort.START_TIME_DESC, limit=1)
        for _ in range(40):
            logs = [entry.message for entry in client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
            if any("done in" in line for line in logs):
                break
            time.sleep(0.5)
        tasks = {t.name for t in client.read_task_runs() if t.flow_run_id == run.id}
    assert any(f"run {result.run_id}" in line for line in logs), logs
    assert any(line.startswith("score-tiny-shapes-clip-shapes: done in") for line in logs), logs
    assert {"prepare-tiny-shapes-clip-shapes", "encode-tiny-shapes-clip-shapes", "score-tiny-shapes-clip-shapes",
            "write-tiny-shapes-clip-shapes"} <= tasks, tasks
