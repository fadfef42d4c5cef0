"""Prefect artifacts for each flow run: a table of its metrics and a markdown summary linking the files it wrote.

They appear on the flow run's page in the Prefect UI (and through the API), so a scheduled nightly run can be read
without opening files. Artifact keys group the same kind of artifact across runs.
"""

from __future__ import annotations

from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from clipcache.flows.orchestration.summary import cache_state, format_value


def _link(path: str) -> str:
    p = Path(path).resolve()
    return f"[{p.name}]({p.as_uri()})"


def publish_evaluation(flow_name: str, run_id: str, results: list, output_dir: str) -> None:
    # the CLI table's cells: values rounded the same way (4 decimals, n/a for NaN), the same cache words
    rows = [{"model": r.model, "dataset": r.dataset, "language": r.language, "task": r.task,
             **({"variant": r.variant} if any(x.variant for x in results) else {}), "metric": name,
             "value": format_value(value) if name else "", "tied": r.tied.get(name, 0), "n": r.n_samples,
             "cache": cache_state(r)}
            for r in results for name, value in (r.metrics.items() or [("", None)])]
    create_table_artifact(key=f"{flow_name}-metrics", table=rows,
                          description=f"clipcache {flow_name} run {run_id}: one row per metric")
    lines = [f"# clipcache {flow_name} · run `{run_id}`", "",
             "| model | dataset | task | cache | result files |", "|---|---|---|---|---|"]
    for r in results:
        files = ", ".join(_link(f) for f in r.files) or "–"
        lines.append(f"| {r.model} | {r.dataset} | {r.task} | {cache_state(r)} | {files} |")
    lines += ["", f"Parquet rows: `{Path(output_dir, 'warehouse').resolve()}` (query with `clipcache query`)."]
    create_markdown_artifact(key=f"{flow_name}-summary", markdown="\n".join(lines))


def publish_conversion(results: list[dict]) -> None:
    rows = []
    for r in results:
        m = r.get("metrics", {})
        rows.append({"model": r["model"], "dataset": r["dataset"], "captioned": m.get("n_captioned"),
                     "failed": m.get("n_failed"), "api_calls": m.get("api_calls"), "save_path": m.get("save_path")})
    create_table_artifact(key="convert-summary", table=rows, description="clipcache convert: one row per dataset")


def publish_report(path: str) -> None:
    create_markdown_artifact(key="report", markdown=f"# clipcache report\n\n{_link(path)} (static HTML)")
