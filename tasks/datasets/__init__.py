"""Dataset registry: a name (plus root/split/limit) to an indexed :class:`EvalDataset`.

- ``shapes`` / ``shapes_retrieval``: the bundled synthetic data (no files needed).
- ``custom``: evalscope's ``image_queries.jsonl`` layout under ``dataset_root`` / ``data_dir``.
- ``imagefolder`` / ``image_labels``: users' classification data (tasks/datasets/labelled.py).
- ``sugar_crepe/<task>`` / ``winoground``: image-caption selection from their local copies (tasks/datasets/selection.py).
- every name of clip_benchmark's builder that reads original files (cifar10, food101, imagenet1k, imagenet-a,
  mscoco_captions, xtd10, ...): those files under ``dataset_root``, as the table ``layouts.json`` says
  (tasks/datasets/layouts.py). A name that is also hosted (imagenet1k, flickr30k, ...) reads its original layout when
  the root holds it, else webdataset shards.
- ``wds/<name>``: the hosted webdataset layout under ``dataset_root`` (a directory or a template with ``{dataset}`` /
  ``{dataset_cleaned}``, as in clip_benchmark).
- any name from ``catalog.csv`` (the 43 CLIP-benchmark datasets): the same webdataset layout under ``dataset_root``.
- readers other packages add with an entry point in the group ``clipcache.datasets`` (tasks/datasets/reader.py).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from functools import cache
from pathlib import Path

from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.tasks.datasets.base import EvalDataset
from clipcache.tasks.registry import Registry

Loader = Callable[[str, Path | None, str, int | None], EvalDataset]
DATASETS: Registry[Loader] = Registry("dataset", DatasetError, entry_point_group="clipcache.datasets")
DATASETS.register("shapes", "clipcache.tasks.datasets.loaders:shapes_classification")
DATASETS.register("shapes_retrieval", "clipcache.tasks.datasets.loaders:shapes_retrieval")
DATASETS.register("custom", "clipcache.tasks.datasets.loaders:custom")
DATASETS.register("imagefolder", "clipcache.tasks.datasets.loaders:imagefolder")
DATASETS.register("image_labels", "clipcache.tasks.datasets.loaders:image_labels")
DATASETS.register("winoground", "clipcache.tasks.datasets.loaders:winoground")
SUGAR_CREPE = tuple(f"sugar_crepe/{task}" for task in ("add_att", "add_obj", "replace_att", "replace_obj",
                                                         "replace_rel", "swap_att", "swap_obj"))
for _name in SUGAR_CREPE:
    DATASETS.register(_name, "clipcache.tasks.datasets.loaders:sugar_crepe")

# The task each registered (non-catalog) dataset serves.
REGISTERED_TASKS = {"shapes": "zeroshot_classification", "shapes_retrieval": "zeroshot_retrieval",
                    "custom": "zeroshot_retrieval", "imagefolder": "zeroshot_classification",
                    "image_labels": "zeroshot_classification", "winoground": "image_caption_selection",
                    **dict.fromkeys(SUGAR_CREPE, "image_caption_selection")}

WDS_PREFIX = "wds/"


@cache
def catalog() -> dict[str, dict[str, str]]:
    with open(Path(__file__).with_name("catalog.csv"), encoding="utf-8") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def format_root(template: str, dataset: str) -> Path:
    """clip_benchmark's ``--dataset_root`` template: ``{dataset}`` and ``{dataset_cleaned}`` (``/`` -> ``-``)."""
    try:
        return Path(template.format(dataset=dataset, dataset_cleaned=dataset.replace("/", "-"))).expanduser()
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"dataset_root: {template!r} is not a valid template "
                          f"(placeholders: {{dataset}}, {{dataset_cleaned}})") from e


def get_reader(name: str) -> Loader:
    """The registered reader of ``name`` (a plugin's DatasetReader class is instantiated and checked)."""
    from clipcache.tasks.datasets.reader import as_reader

    return as_reader(name, DATASETS.get(name), DATASETS.origin(name))


def registered_task(name: str) -> str:
    """The task a registered dataset serves: the built-ins' from REGISTERED_TASKS, a plugin reader's own ``task``."""
    task = REGISTERED_TASKS.get(name) or getattr(get_reader(name), "task", None)
    if task is None:
        raise DatasetError(f"dataset {name!r} ({DATASETS.origin(name)}) declares no task: a plugin's reader is a "
                           f"DatasetReader with task = 'zeroshot_classification' or 'zeroshot_retrieval'")
    return task


def original_names() -> list[str]:
    """Names read only from their original layout (not hosted): cifar10, food101, caltech101, xtd10, ..."""
    from clipcache.tasks.datasets.layouts import layouts

    return sorted(n for n in layouts() if n not in catalog())


def known_names() -> list[str]:
    return DATASETS.names() + sorted(set(catalog()) | set(original_names()))


def check_name(name: str, dataset_root: str | None = None) -> None:
    """Raise a "Did you mean" error for a name that can never resolve (before any work starts). Any name of a BEIR
    folder goes (text retrieval)."""
    if name.startswith(WDS_PREFIX) or name in DATASETS or name in catalog() or name in original_names():
        return
    if dataset_root and default_task(name, dataset_root) == "text_retrieval":
        return
    import difflib

    close = difflib.get_close_matches(name, known_names(), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else " Use wds/<name> with --dataset_root for a local " \
                                                               "webdataset folder, or custom with a data_dir."
    raise DatasetError(f"Unknown dataset {name!r}.{hint}")


def default_task(name: str, dataset_root: str | None) -> str:
    """The task a dataset is evaluated with under ``--task auto``, found without indexing it: the registry and the
    catalog say, a BEIR folder is text retrieval, a webdataset folder says in dataset_type.txt."""
    root = format_root(dataset_root, name[len(WDS_PREFIX):] if name.startswith(WDS_PREFIX) else name) \
        if dataset_root else None
    if root is not None and (root / "corpus.jsonl").is_file() and (root / "queries.jsonl").is_file():
        return "text_retrieval"
    if name in DATASETS:
        return registered_task(name)
    if name in original_names():
        from clipcache.tasks.datasets.layouts import task_of

        return task_of(name)
    if root is not None and (root / "dataset_type.txt").is_file():
        kind = (root / "dataset_type.txt").read_text(encoding="utf-8").strip().lower()
        return "zeroshot_retrieval" if kind == "retrieval" else "zeroshot_classification"
    bare = name[len(WDS_PREFIX):] if name.startswith(WDS_PREFIX) else name
    if bare in catalog():
        return catalog()[bare]["task"]
    return "zeroshot_classification"


def open_dataset(name: str, dataset_root: str | None, split: str, limit: int | None, *, hub: str = "huggingface",
                 cache_dir: str | None = None, offline: bool = False, progress=None,
                 language: str = "en", annotation_file: str | None = None) -> EvalDataset:
    """Index a dataset. Hosted names without ``dataset_root`` are fetched from ``hub`` into ``cache_dir`` first.
    ``language`` reaches the readers that take it (files that differ by language, e.g. Flickr's ``_zh`` captions);
    ``annotation_file`` replaces a caption dataset's default annotation file (clip_benchmark's --annotation_file)."""
    check_name(name)
    if name in DATASETS:
        import inspect

        root = format_root(dataset_root, name) if dataset_root else None
        reader = get_reader(name)
        takes_language = "language" in inspect.signature(reader).parameters
        return reader(name, root, split, limit, **({"language": language} if takes_language else {}))
    from clipcache.tasks.datasets.wds import load_webdataset

    bare = name[len(WDS_PREFIX):] if name.startswith(WDS_PREFIX) else name
    if name in original_names() and not dataset_root:
        from clipcache.tasks.datasets.layouts import layouts

        entry = layouts()[name]
        raise DatasetError(f"dataset {name!r} needs --dataset_root: the folder holding {entry['folder']} (files: "
                           f"{entry['source']})")
    if dataset_root:
        root = format_root(dataset_root, bare)
        if name == bare:  # a name of clip_benchmark's builder: its original layout when the root holds it
            from clipcache.tasks.datasets.layouts import layouts, open_original, present

            if name in layouts() and (name in original_names() or present(name, root, split)):
                return open_original(name, root, split, limit, language=language, annotation_file=annotation_file)
            if name in layouts():
                if annotation_file:
                    entry = layouts()[name]
                    raise DatasetError(f"dataset {name!r}: --annotation_file replaces the caption file of "
                                       f"clip_benchmark's original layout, which is not under {root} "
                                       f"({entry['folder']}); a webdataset copy has its captions inside")
                try:
                    return load_webdataset(name, root, split, limit)
                except DatasetError as e:
                    entry = layouts()[name]
                    raise DatasetError(f"{e}; nor is clip_benchmark's original layout there: "
                                       f"{entry['folder']} (files: {entry['source']})") from e
        return load_webdataset(name, root, split, limit)
    if cache_dir is None:
        raise DatasetError(f"dataset {name!r} needs --dataset_root (a local folder in the clip_benchmark webdataset "
                           f"layout) or a cache_dir to download it into")
    from clipcache.tasks.datasets.download import fetch_dataset

    root = fetch_dataset(name, split, hub, cache_dir, offline=offline, progress=progress)
    return load_webdataset(name, root, split, limit)
