"""`clipcache results migrate`: rewrite result files of older releases in the current schema, nothing lost.

Schema 1 (clipcache 0.1) rows lack the experiment's identity. It is rebuilt from what they hold and from their run's
stored configuration: the sample limit, the precision (amp and device), whether class names or templates were
replaced (a what-if), and the checkpoint: the model is resolved again and, when it still has the fingerprint the row
recorded, the row gets its checkpoint identity and label, so old and new runs of one experiment line up; otherwise
the recorded fingerprint stands for it. Classification rows that used the dataset's own prompts get the hash of
those prompts (part of the experiment's identity), computed as a new run computes it; when the dataset cannot be
opened here (migration never downloads), the row keeps no prompts hash and the command's output says so. Every
schema-1 column keeps its value (the compaction checks row counts and checksums over them), and files are replaced
atomically (storage/compaction.py).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from clipcache.storage.compaction import compact
from clipcache.storage.errors import ClipcacheError
from clipcache.storage.experiment import Experiment
from clipcache.storage.hashing import FileHashMemo
from clipcache.storage.paths import local_dir
from clipcache.storage.results import METRIC_SCHEMA, RUN_SCHEMA, SCHEMA_VERSION, visible_files, warehouse_dir


def _run_configs(output_dir: str) -> dict[str, dict[str, Any]]:
    configs = {}
    for f in visible_files(warehouse_dir(output_dir) / "runs"):
        with f.open("rb") as fh:
            for row in pq.read_table(fh, columns=["run_id", "config", "device"]).to_pylist():
                try:
                    config = json.loads(row["config"] or "{}")
                except ValueError:
                    config = {}
                configs[row["run_id"]] = {**config, "_device": row["device"] or ""}
    return configs


@cache
def _checkpoint(model: str, pretrained: str | None, fingerprint: str | None) -> tuple[str, str | None, str]:
    """(checkpoint identity, label, display model name) of a schema-1 row's model."""
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    try:
        spec = ModelSpec(model_name=model, pretrained=pretrained)
        resolved = resolve_model(spec, FileHashMemo(None))
        if resolved.fingerprint == fingerprint:
            return resolved.checkpoint, resolved.checkpoint_label, spec.display_name
    except (ClipcacheError, ValueError):
        pass
    label = pretrained.rstrip("/").split("/")[-1] if pretrained else None
    return f"fingerprint:{fingerprint}", label, model


class DefaultPrompts:
    """The hash of a dataset's own class prompts in a language, per (dataset, run configuration), computed by the
    task's own ``prepare`` so that it is the value a new run records; what could not be opened is remembered for the
    command's output."""

    def __init__(self) -> None:
        self._found: dict[tuple, str | None] = {}
        self.unavailable: dict[str, str] = {}  # dataset -> why its prompts could not be read

    def sha256(self, dataset: str, language: str, config: dict[str, Any]) -> str | None:
        from clipcache.tasks.evaluation import get_task
        from clipcache.tasks.evaluation.base import DataSource, PromptSettings
        from clipcache.tasks.progress import StageProgress

        source = DataSource(dataset, config.get("dataset_root"), config.get("split") or "test", config.get("limit"),
                            config.get("hub") or "huggingface", str(local_dir(config.get("cache_dir") or "cache")),
                            offline=True)
        key = (source, language)
        if key not in self._found:
            try:
                prepared = get_task("zeroshot_classification").prepare(source, PromptSettings(language),
                                                                       StageProgress(enabled=False))
                self._found[key] = prepared.prompts_sha256
            except (ClipcacheError, OSError) as e:
                self._found[key] = None
                self.unavailable.setdefault(dataset, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return self._found[key]


def _precision(config: dict[str, Any]) -> str:
    if not config.get("amp"):
        return "fp32"
    return "amp_fp16" if str(config.get("_device", "")).startswith("cuda") else "amp_bf16"


def upgrade(configs: dict[str, dict[str, Any]], prompts: DefaultPrompts):
    def rows_in_current_schema(table: str, part: pa.Table) -> pa.Table:
        rows = part.to_pylist()
        for row in rows:
            row["schema_version"] = SCHEMA_VERSION
            if table == "runs":
                row.setdefault("kind", "evaluate")
                continue
            config = configs.get(row["run_id"], {})
            checkpoint, label, _ = _checkpoint(row["model"], row.get("pretrained"), row.get("model_fingerprint"))
            language = row["language"] or "en"
            default_prompts = not (config.get("classnames") or config.get("templates"))
            prompts_sha256 = None
            if row["task"] == "zeroshot_classification" and default_prompts:
                prompts_sha256 = prompts.sha256(row["dataset"], language, config)
            experiment = Experiment(
                model=row["model"], checkpoint=checkpoint, dataset=row["dataset"], split=row["split"] or "test",
                language=language, task=row["task"], precision=_precision(config), sample_limit=config.get("limit"),
                prompts=prompts_sha256, default_prompts=default_prompts, pretrained=label)
            row.update({**experiment.columns(), "model": row["model"], "pretrained": row.get("pretrained"),
                        "tied_queries": None})
        schema = METRIC_SCHEMA if table == "metrics" else RUN_SCHEMA
        return pa.Table.from_pylist(rows, schema=schema)

    return rows_in_current_schema


def migrate(output_dir: str) -> list[str]:
    configs = _run_configs(output_dir)
    prompts = DefaultPrompts()
    lines = []
    for table in ("runs", "metrics"):
        report = compact(output_dir, table, upgrade=upgrade(configs, prompts))
        lines.append(f"{table}: {report.files_before} files -> {report.files_after}, {report.rows_after:,} rows, "
                     f"every earlier column unchanged (checksum {report.checksum_after})")
        if (report.rows_before, report.checksum_before) != (report.rows_after, report.checksum_after):
            raise ClipcacheError(f"migration of {table} changed the data: {report.rows_before} rows / "
                                 f"{report.checksum_before} before, {report.rows_after} / {report.checksum_after} "
                                 f"after")
    for dataset, why in sorted(prompts.unavailable.items()):
        lines.append(f"metrics: classification rows of {dataset} keep no prompts hash (the dataset could not be "
                     f"opened here: {why}); a new run of them is another experiment until they are migrated where "
                     f"the dataset is")
    return lines
