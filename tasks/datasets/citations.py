"""Licence, citation and reference of a dataset, where a real source states them: mteb's own ``TaskMetadata``
(``license``, ``bibtex_citation``, ``reference``) of the same dataset.

Every ``mieb:<task>`` name reads its own task's metadata; the clip_benchmark, compositionality and DataComp names
that mteb has a task for are listed in citations.json (name -> mteb task). Nothing is copied: the facts are read
from the installed mteb when asked (``clipcache datasets --details NAME`` / ``--format json``), so naming and listing
datasets stays light, and a record says where its facts came from (``facts_from``). A dataset no source covers
keeps empty fields, and so does a licence mteb gives as "not specified".
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.record import DatasetRecord

MIEB_PREFIX = "mieb:"
UNSTATED = {"", "not specified"}  # what mteb writes where the licence is not known


@cache
def mteb_tasks() -> dict[str, str]:
    """Dataset name -> the mteb task of the same dataset (citations.json)."""
    data = json.loads(Path(__file__).with_name("citations.json").read_text(encoding="utf-8"))
    return dict(data["mteb"])


def mteb_task_of(name: str) -> str | None:
    """The mteb task whose metadata states ``name``'s facts, or None."""
    if name.startswith(MIEB_PREFIX) and "<" not in name:
        return name.removeprefix(MIEB_PREFIX).strip()
    return mteb_tasks().get(name)


def _metadata(task: str) -> object:
    try:
        import mteb
    except ImportError:  # mteb is a dependency; a trimmed install simply has no facts to show
        return None
    try:
        return mteb.get_task(task).metadata
    except (KeyError, ValueError) as e:
        raise DatasetError(f"mteb {mteb.__version__} has no task {task!r} ({type(e).__name__}: {e})") from e


def cited(record: DatasetRecord) -> DatasetRecord:
    """``record`` with the licence, citation and reference its source states, and ``facts_from`` naming it
    (unchanged where no source covers the dataset)."""
    task = mteb_task_of(record.name)
    meta = _metadata(task) if task is not None else None
    if meta is None:
        return record
    import mteb

    licence = str(getattr(meta, "license", None) or "")
    return replace(record, licence="" if licence.strip().lower() in UNSTATED else licence,
                   citation=str(getattr(meta, "bibtex_citation", None) or "").strip(),
                   reference=str(getattr(meta, "reference", None) or ""),
                   facts_from=f"mteb {mteb.__version__} TaskMetadata of {task}")
