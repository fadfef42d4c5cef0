"""Building blocks the mteb/MIEB tests share (test_mieb_parity, test_mieb_runner, test_vidore,
test_composed_retrieval): the tiny bundled model as a session, local copies in the layouts mteb loads from the hub
(``configs`` in a README, one parquet file per config and split), and ``mteb.evaluate`` itself on such a copy with
the same model and no cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

BATCH = 8


def session() -> tuple[ModelSession, FileHashMemo]:
    """A fresh session of the bundled tiny-shapes-clip on the CPU, fp32 (a new one loads the model again)."""
    memo = FileHashMemo(None)
    return ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                        amp=False, precision="fp32"), memo


def hub_readme(*configs: str) -> str:
    """A hub dataset card whose ``configs`` map each name to ``<name>/test-*.parquet``."""
    entries = "".join(f"- config_name: {name}\n  data_files:\n  - split: test\n    path: {name}/test-*.parquet\n"
                      for name in configs)
    return f"---\nconfigs:\n{entries}---\n"


RETRIEVAL_README = hub_readme("corpus", "queries", "default")  # mteb's any2any retrieval layout: default = qrels
BEIR_README = hub_readme("corpus", "queries", "qrels")  # ViDoRe's BEIR-style layout


def write_configs(root: Path, parts: dict[str, Any], readme: str) -> Path:
    """Each config's ``datasets.Dataset`` as ``<root>/<config>/test-00000-of-00001.parquet``, and the card."""
    for name, part in parts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        part.to_parquet(str(root / name / "test-00000-of-00001.parquet"))
    (root / "README.md").write_text(readme)
    return root


def write_split(root: Path, split: str, table: Any) -> None:
    """A single-config copy's split: ``<root>/data/<split>-00000-of-00001.parquet``."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    table.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))


def mteb_uncached(name: str, root: Path, model: Any, language: str = "en") -> tuple[dict, Any]:
    """``mteb.evaluate`` itself on the local copy (mteb's loader and evaluator), the same model, no cache: the
    scores of split test and the encoder (its ``counts`` say how many inputs it encoded)."""
    import mteb

    from clipcache.tasks.datasets.mieb.mieb_tasks import load_mieb
    from clipcache.tasks.encode.mteb_encoder import UncachedMtebEncoder, model_meta

    data = load_mieb(name, root, "test", language)
    encoder = UncachedMtebEncoder(model, model_meta("clipcache/tiny-shapes-clip", "uncached"))
    result = mteb.evaluate(encoder, data.task, cache=None, co2_tracker=False, show_progress_bar=False,
                           encode_kwargs={"batch_size": BATCH})
    [scores] = result.task_results[0].scores["test"]
    return scores, encoder
