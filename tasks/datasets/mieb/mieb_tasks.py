"""MIEB tasks by their mteb names (``mieb:<task>``): mteb 2.x's own task object with its data loaded, from a local
copy (``--dataset_root``) or the hub. The evaluation that runs it is tasks/evaluation/mieb_runner.py.

A local copy is what mteb loads from the hub, read from the folder: a snapshot of the dataset repository (``hf
download mteb/cifar10 --repo-type dataset --local-dir DIR``: Parquet files, and for retrieval tasks the README's
``configs``), which ``datasets.load_dataset`` reads from the folder in place of the repository, through mteb's own
``load_data`` and ``dataset_transform``; or a ``datasets`` ``save_to_disk`` folder of a task that loads one dataset
(not retrieval, not multilingual). ``--dataset_root`` may be a template with ``{dataset}`` (the mteb task name).

An aggregate task (MIEB's VisualSTS17Multilingual, VisualSTS-b-Multilingual: the mean of other tasks' main scores
over all their subsets) loads each task it aggregates, every subset of the split asked for: from
``<root>/<that task's name>`` where that folder exists, else from the root itself (one aggregated task).
"""

from __future__ import annotations

import atexit
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets.mieb.mieb_images import check_mieb_images
from clipcache.tasks.datasets.record import DatasetRecord
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource, OpenOptions, format_root

PREFIX = "mieb:"
NAME = "mieb"
MODALITIES = {"text", "image"}


@dataclass
class MiebData:
    """An mteb task with its data loaded, restricted to one split and one hf subset."""

    name: str  # the mteb task name
    task: Any  # mteb.abstasks.AbsTask
    split: str
    subset: str
    identity: dict[str, Any]
    n_samples: int
    root: str | None = None


def task_name(dataset: str) -> str:
    name = dataset.removeprefix(PREFIX).strip()
    if not dataset.startswith(PREFIX) or not name:
        raise DatasetError(f"dataset {dataset!r}: an mteb task is named mieb:<task name>, e.g. mieb:CIFAR10ZeroShot")
    return name


def get_mteb_task(name: str) -> Any:
    """mteb's task object for ``name``; an unknown name is one line, with mteb's "Did you mean"."""
    import mteb

    try:
        return mteb.get_task(name)
    except KeyError as e:
        said = str(e.args[0]) if e.args else ""
        hint = said[said.index("Did you mean"):].strip() if "Did you mean" in said else ""
        raise DatasetError(f"Unknown MIEB task {name!r} (mieb:<mteb task name>).{' ' + hint if hint else ''}") from e


@contextmanager
def datasets_cache(folder: Path | None) -> Iterator[None]:
    """``datasets`` writes an Arrow copy of what ``load_dataset`` reads (the hub's files or a local snapshot) under
    its cache folder, ``~/.cache/huggingface/datasets`` unless told otherwise: point it at ``folder`` (under the
    run's ``--cache_dir``) while mteb loads, or at a temporary folder removed when the process exits."""
    import datasets.config as config  # type: ignore[import-untyped]

    if folder is None:
        scratch = tempfile.TemporaryDirectory(prefix="clipcache-hf-datasets-")
        atexit.register(scratch.cleanup)
        folder = Path(scratch.name)
    names = ("HF_DATASETS_CACHE", "DOWNLOADED_DATASETS_PATH", "EXTRACTED_DATASETS_PATH")
    saved = {n: getattr(config, n) for n in names}
    config.HF_DATASETS_CACHE = folder
    config.DOWNLOADED_DATASETS_PATH = folder / "downloads"
    config.EXTRACTED_DATASETS_PATH = folder / "downloads" / "extracted"
    try:
        yield
    finally:
        for n, value in saved.items():
            setattr(config, n, value)


def load_mieb(name: str, root: Path | None, split: str, language: str, hf_cache: Path | None = None) -> MiebData:
    """mteb's task ``name`` with the data of ``split`` (and of the hf subset ``language`` where the task has
    several) loaded from ``root``, or from the hub without one; ``datasets``' own cache in ``hf_cache``."""
    from clipcache.tasks.models.loader import library_version

    task = get_mteb_task(name)
    meta = task.metadata
    odd = sorted(set(meta.modalities) - MODALITIES)
    if odd:
        raise DatasetError(f"mieb:{name} takes {', '.join(odd)} inputs; clipcache's models encode images and texts")
    if getattr(task, "is_aggregate", False):
        return _load_aggregate(task, name, root, split, hf_cache)
    if split not in task.eval_splits:
        raise DatasetError(f"mieb:{name} evaluates split {', '.join(task.eval_splits)}, not {split!r}: pass "
                           f"--split {task.eval_splits[0]}")
    task.filter_eval_splits([split])
    subsets = list(task.hf_subsets)
    if len(subsets) > 1:
        if language not in subsets:
            shown = ", ".join(subsets[:12]) + (", ..." if len(subsets) > 12 else "")
            raise DatasetError(f"mieb:{name} has {len(subsets)} subsets ({shown}): choose one with --language")
        task.hf_subsets = [language]
    subset = task.hf_subsets[0]
    with datasets_cache(hf_cache):
        _load(task, name, root, split)
    if hasattr(task, "convert_v1_dataset_format_to_v2"):  # retrieval tasks loaded in mteb's v1 form (the ViDoRe ones)
        task.convert_v1_dataset_format_to_v2(num_proc=None)  # what mteb's evaluate does first; a no-op otherwise
    check_mieb_images(name, task.dataset, root)  # paths stay in root, bombs and junk are one line (issue #45)
    # features: mteb gets raw vectors (row x norm) and sums raw image + text, as its CLIP wrappers do; results made
    # from normalised vectors (before the image pool kept norms) are another experiment
    identity = {"mteb_task": name, "dataset": dict(meta.dataset), "hf_subset": subset,
                "mteb": library_version("mteb"), "features": "raw"}
    return MiebData(name, task, split, subset, identity, _count(task.dataset, split, subset),
                    str(root) if root else None)


def _load_aggregate(task: Any, name: str, root: Path | None, split: str, hf_cache: Path | None) -> MiebData:
    """An aggregate task with each task it aggregates loaded (all their subsets): their own copies, so the task
    objects mteb keeps in the aggregate's class metadata are never loaded or changed."""
    import copy

    from clipcache.tasks.models.loader import library_version

    meta = task.metadata
    if split not in meta.eval_splits:
        raise DatasetError(f"mieb:{name} evaluates split {', '.join(meta.eval_splits)}, not {split!r}: pass "
                           f"--split {meta.eval_splits[0]}")
    parts = [copy.deepcopy(t) for t in meta.tasks]
    count = 0
    for part in parts:
        part_name = part.metadata.name
        part_root = root / part_name if root is not None and (root / part_name).is_dir() else root
        part.filter_eval_splits([split])
        with datasets_cache(hf_cache):
            _load(part, part_name, part_root, split)
        check_mieb_images(part_name, part.dataset, part_root)  # as for one task (below)
        count += sum(_count(part.dataset, split, subset) for subset in part.hf_subsets)
    task.metadata = meta.model_copy(update={"tasks": parts, "eval_splits": [split]})
    task.tasks, task.taskname_to_task = parts, {p.metadata.name: p for p in parts}
    identity = {"mteb_task": name, "aggregates": [{"mteb_task": p.metadata.name, "dataset": dict(p.metadata.dataset),
                                                   "hf_subsets": list(p.hf_subsets)} for p in parts],
                "hf_subset": "default", "mteb": library_version("mteb"), "features": "raw"}
    return MiebData(name, task, split, "default", identity, count, str(root) if root else None)


def _load(task: Any, name: str, root: Path | None, split: str) -> None:
    from mteb.abstasks import AbsTaskRetrieval

    dataset = task.metadata.dataset
    if root is None:
        try:
            task.load_data()
        except Exception as e:  # datasets raises many types for a hub it cannot reach
            if _offline(e):
                revision = str(dataset.get("revision") or "main")
                raise DatasetError(
                    f"mieb:{name}: the Hugging Face hub is unreachable ({type(e).__name__}), so mteb cannot fetch "
                    f"{dataset['path']}@{revision[:12]}; download it where the hub is reachable (hf download "
                    f"{dataset['path']} --repo-type dataset --revision {revision} --local-dir DIR) and pass "
                    f"--dataset_root DIR") from e
            raise DatasetError(f"mieb:{name}: mteb cannot load {dataset['path']}: {_first_line(e)}") from e
        return
    if not root.is_dir():
        raise DatasetError(f"mieb:{name}: --dataset_root {root} is not a folder (a snapshot of "
                           f"{dataset['path']}, or a datasets save_to_disk folder)")
    if (root / "dataset_dict.json").is_file() or (root / "dataset_info.json").is_file():
        if isinstance(task, AbsTaskRetrieval) or task.metadata.is_multilingual:
            raise DatasetError(f"mieb:{name}: a save_to_disk folder holds one dataset, and this task loads several "
                               f"(corpus, queries, qrels or subsets); use a snapshot of {dataset['path']}")
        from datasets import Dataset, DatasetDict, load_from_disk

        try:
            loaded = load_from_disk(str(root))
        except (OSError, ValueError) as e:
            raise DatasetError(f"mieb:{name}: {root} does not load with datasets.load_from_disk: "
                               f"{_first_line(e)}") from e
        task.dataset = DatasetDict({split: loaded}) if isinstance(loaded, Dataset) else loaded
        task.dataset_transform()
        task.data_loaded = True
        return
    # mteb's own loading, from the folder in place of the repository (the class's metadata is left alone)
    task.metadata = task.metadata.model_copy(update={"dataset": {**dataset, "path": str(root)}})
    try:
        task.load_data()
    except Exception as e:  # datasets, pyarrow and the task's own transform raise many types for a bad copy
        raise DatasetError(f"mieb:{name}: mteb cannot load {root} as {dataset['path']}: {_first_line(e)}") from e


def _offline(error: BaseException) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return True
    text = f"{type(error).__name__} {error}".lower()
    return any(s in text for s in ("offline", "connection", "resolve", "timed out", "unreachable", "max retries"))


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _count(dataset: Any, split: str, subset: str) -> int:
    """Samples mteb evaluates: rows of the split, or a retrieval task's queries."""
    node = dataset
    if isinstance(node, dict) and subset in node and split not in node:
        node = node[subset]
    node = node[split] if split in node else node
    if isinstance(node, dict):
        node = node.get("queries", node.get("test", []))
    try:
        return len(node)
    except TypeError:
        return 0



class MiebSource(DatasetSource):
    """``mieb:<task>``: asked before every other source; the task name is checked when mteb is imported (prepare),
    since importing mteb is too slow for a name check."""

    name = NAME
    description = "mieb:<mteb task name>: an mteb (MIEB) task, its data from --dataset_root or the hub"
    priority = 1
    only_for = (NAME,)

    def claims(self, ref: DatasetRef) -> bool:
        return ref.name.startswith(PREFIX)

    def task(self, ref: DatasetRef) -> str:
        return NAME

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> MiebData:
        name = task_name(ref.name)
        cache = options.cache_dir
        hf_cache = Path(cache) / "hf_datasets" if cache and "://" not in cache else None  # remote: a temporary one
        return load_mieb(name, format_root(ref.dataset_root, name) if ref.dataset_root else None, split,
                         options.language, hf_cache)

    def records(self) -> list[DatasetRecord]:
        """One pattern: the task names are mteb's (importing mteb to list them is too slow for a listing)."""
        return [DatasetRecord(f"{PREFIX}<mteb task name>", NAME, (self.name,),
                              ("a snapshot of the task's Hugging Face dataset (Parquet files or save_to_disk)",),
                              hosted="the task's Hugging Face dataset (mteb's loader)")]
