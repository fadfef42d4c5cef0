"""Datasets: a name (plus --dataset_root, split and limit) to indexed data, found through one lookup.

Every place data can come from is a dataset source (tasks/datasets/source.py) in ``SOURCES``, declared once in
tasks/datasets/declared.py; ``check_name``,
``default_task`` and ``open_dataset`` ask them in priority order and use the first that claims the name and root
(tasks/datasets/sources.py lists them):

- ``beir`` / ``any2any``: a ``--dataset_root`` holding corpus.jsonl and queries.jsonl, under any name (text and
  any-to-any retrieval read it themselves; ``open_dataset`` opens image datasets and passes them by).
- ``registered``: the readers in ``DATASETS``: ``shapes`` / ``shapes_retrieval`` (bundled), ``custom`` (evalscope's
  ``image_queries.jsonl``), ``imagefolder`` / ``image_labels``, ``sugar_crepe/<task>`` / ``winoground``,
  ``aro/<set>`` / ``valse/<piece>`` / ``mmvp_vlm`` (tasks/datasets/compositionality/compositionality.py),
  ``cola/multi_objects`` / ``crepe/<set>`` / ``vl_checklist/<type>`` (compositionality/compositionality_more.py),
  ``svo_probes`` (compositionality/svo_probes.py), and readers other packages add with an entry point in the group
  ``clipcache.datasets`` (tasks/datasets/reader.py).
- a plugin's own source (a family of names with its own lookup): a DatasetSource another package adds with an
  entry point in the group ``clipcache.dataset_sources``; one that cannot be imported is left out with a warning.
  The plugins' sources are asked only about a name no built-in source claims (its own names, a typo, the listing):
  the entry points are then read and each module imported once per process, and a name clipcache knows is resolved
  without either.
- ``group_layouts``: DataComp's WILDS and fairness sets with per-sample metadata (``wilds/iwildcam``,
  ``fairness/geode``, ...; tasks/datasets/datacomp/group_layouts.py): its webdataset copies or WILDS' folders.
- ``original``: every name of clip_benchmark's builder that reads original files (cifar10, food101, imagenet1k,
  mscoco_captions, xtd10, ...), as the table ``layouts.json`` says (tasks/datasets/clip_benchmark/layouts.py). A
  name that is also hosted (imagenet1k, flickr30k, ...) reads its original layout when the root holds it, else
  webdataset shards.
- ``webdataset``: ``wds/<name>`` or a ``catalog.csv`` name with ``--dataset_root`` (a directory or a template with
  ``{dataset}`` / ``{dataset_cleaned}``, as in clip_benchmark): the hosted webdataset layout there.
- ``hosted``: a ``catalog.csv`` name (the 43 CLIP-benchmark datasets) without a root: downloaded, then read.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from clipcache.storage.errors import ClipcacheError, DatasetError
from clipcache.tasks.datasets.declared import BUILTIN_SOURCES, declared
from clipcache.tasks.datasets.record import DatasetRecord, merge_records
from clipcache.tasks.datasets.source import WDS_PREFIX, DatasetRef, DatasetSource, OpenOptions, format_root
from clipcache.tasks.registry import Registry

if TYPE_CHECKING:  # naming datasets must not import numpy (base) or any reader
    from clipcache.tasks.datasets.base import EvalDataset

    Loader = Callable[[str, Path | None, str, int | None], EvalDataset]

__all__ = ["DATASETS", "SOURCES", "WDS_PREFIX", "DatasetRecord", "DatasetRef", "DatasetSource", "OpenOptions",
           "broken_sources", "catalog", "check_name", "dataset_catalog", "default_task", "format_root", "get_reader",
           "get_source", "known_names", "open_dataset", "original_names", "record_of", "registered_task",
           "sources_by_priority"]

HERE = Path(__file__).parent
T = TypeVar("T")
DATASETS: Registry[Loader] = Registry("dataset", DatasetError, entry_point_group="clipcache.datasets")
DATASETS.register("shapes", "clipcache.tasks.datasets.loaders:ShapesClassification")
DATASETS.register("shapes_retrieval", "clipcache.tasks.datasets.loaders:ShapesRetrieval")
DATASETS.register("custom", "clipcache.tasks.datasets.loaders:ImageQueries")
DATASETS.register("imagefolder", "clipcache.tasks.datasets.loaders:ImageFolder")
DATASETS.register("image_labels", "clipcache.tasks.datasets.loaders:ImageLabels")
DATASETS.register("winoground", "clipcache.tasks.datasets.loaders:Winoground")
SUGAR_CREPE = tuple(f"sugar_crepe/{task}" for task in ("add_att", "add_obj", "replace_att", "replace_obj",
                                                         "replace_rel", "swap_att", "swap_obj"))
for _name in SUGAR_CREPE:
    DATASETS.register(_name, "clipcache.tasks.datasets.loaders:SugarCrepe")
# ARO and VALSE (compositionality/compositionality.py); VALSE's pieces are listed in compositionality.json
for _name in ("aro/vg_relation", "aro/vg_attribution"):
    DATASETS.register(_name, "clipcache.tasks.datasets.loaders:AroVisualGenome")
for _name in ("aro/coco_order", "aro/flickr30k_order"):
    DATASETS.register(_name, "clipcache.tasks.datasets.loaders:AroOrder")
VALSE = tuple(f"valse/{piece}" for piece in json.loads((HERE / "compositionality" / "compositionality.json")
                                                        .read_text(encoding="utf-8"))["valse_pieces"])
for _name in VALSE:
    DATASETS.register(_name, "clipcache.tasks.datasets.loaders:Valse")
DATASETS.register("mmvp_vlm", "clipcache.tasks.datasets.loaders:MmvpVlm")
# COLA, CREPE and VL-CheckList (compositionality/compositionality_more.py; CREPE's sets and VL-CheckList's types are
# listed in compositionality_more.json)
_MORE = json.loads((HERE / "compositionality" / "compositionality_more.json").read_text(encoding="utf-8"))
_COMPOSITIONALITY = "clipcache.tasks.datasets.compositionality"
DATASETS.register("cola/multi_objects", f"{_COMPOSITIONALITY}.compositionality_more:Cola")
for _name in (*(f"crepe/productivity/{t}" for t in _MORE["crepe_productivity_types"]),
              *(f"crepe/systematicity/{t}/{d}" for t in _MORE["crepe_systematicity_types"]
                for d in _MORE["crepe_train_datasets"])):
    DATASETS.register(_name, f"{_COMPOSITIONALITY}.compositionality_more:Crepe")
for _name in _MORE["vl_checklist_types"]:
    DATASETS.register(f"vl_checklist/{_name}", f"{_COMPOSITIONALITY}.compositionality_more:VlChecklist")
DATASETS.register("svo_probes", f"{_COMPOSITIONALITY}.svo_probes:SvoProbes")

# The built-in sources, from their declarations (tasks/datasets/declared.py); other packages add theirs with an entry
# point in the group clipcache.dataset_sources (name = "module:DatasetSourceClass").
SOURCES: Registry[DatasetSource] = Registry("dataset source", DatasetError,
                                            entry_point_group="clipcache.dataset_sources")
for _name, _declared in BUILTIN_SOURCES.items():
    SOURCES.register(_name, _declared.target)


@cache
def catalog() -> dict[str, dict[str, str]]:
    with open(HERE / "clip_benchmark" / "catalog.csv", encoding="utf-8") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def get_reader(name: str) -> Any:
    """The registered reader of ``name`` (a DatasetReader class is instantiated and checked)."""
    from clipcache.tasks.datasets.reader import as_reader

    return as_reader(name, DATASETS.get(name), DATASETS.origin(name))


def registered_task(name: str) -> str:
    """The task a registered dataset serves: its reader's ``task``."""
    task = getattr(get_reader(name), "task", None)
    if task is None:
        raise DatasetError(f"dataset {name!r} ({DATASETS.origin(name)}) declares no task: a plugin's reader is a "
                           f"DatasetReader with task = 'zeroshot_classification' or 'zeroshot_retrieval'")
    return str(task)


def original_names() -> list[str]:
    """Names read only from their original layout (not hosted): cifar10, food101, caltech101, xtd10, ..."""
    from clipcache.tasks.datasets.clip_benchmark.layouts import layouts

    return sorted(n for n in layouts() if n not in catalog())


def get_source(name: str, *, plugins: bool = True) -> DatasetSource:
    """The registered source ``name``; the registry may hold a DatasetSource instance or its class.
    ``plugins=False``: a built-in source, found without reading the entry points."""
    obj = SOURCES.get(name, plugins=plugins)
    if isinstance(obj, type) and issubclass(obj, DatasetSource):
        obj = obj()
    if not isinstance(obj, DatasetSource):
        raise DatasetError(f"dataset source {name!r} ({SOURCES.origin(name)}) is not a DatasetSource (got "
                           f"{type(obj).__name__}); an entry point in clipcache.dataset_sources must name a "
                           f"DatasetSource subclass or instance")
    if obj.name != name:
        raise DatasetError(f"dataset source {name!r} ({SOURCES.origin(name)}) calls itself {obj.name!r}: a "
                           f"source's name is its entry point's name")
    return obj


def _usable(names: list[str], *, plugins: bool = True) -> list[DatasetSource]:
    """The sources ``names``, leaving out a plugin's source that cannot be used (warned once, in one line): one broken
    package does not stop the datasets it was never going to read. A built-in source's error is raised.
    ``plugins=False``: ``names`` are built-in sources (the entry points are not read)."""
    sources = []
    for name in names:
        try:
            sources.append(get_source(name, plugins=plugins))
        except DatasetError as e:
            if SOURCES.origin(name) == "clipcache":
                raise
            _warn(str(e))
    return sources


_warned: set[str] = set()


def _warn(problem: str) -> None:
    if problem not in _warned:
        _warned.add(problem)
        logging.getLogger("clipcache.datasets").warning("dataset source left out: %s", problem)


def _ask(source: DatasetSource, question: Callable[[], T], default: T) -> T:
    """A source's answer; a plugin's source that fails with an error of its own (not a clipcache error, which says
    what to fix) is left out of this question with one warning line naming its entry point, not a traceback."""
    origin = SOURCES.origin(source.name)
    if origin == "clipcache":
        return question()
    try:
        return question()
    except ClipcacheError:
        raise
    except Exception as e:  # noqa: BLE001 - another package's bug must not stop clipcache's own names
        _warn(f"dataset source {source.name!r} ({origin}) failed: {type(e).__name__}: {e}")
        return default


def broken_sources() -> list[str]:
    """What is wrong with each plugin source that cannot be used (built-in ones are not imported here)."""
    broken = []
    for name in _plugin_names():
        try:
            get_source(name)
        except DatasetError as e:
            broken.append(str(e))
    return broken


def sources_by_priority(ref: DatasetRef | None = None) -> list[DatasetSource]:
    """Every source by priority; with ``ref``, those that may be asked about it in the order the lookup asks them
    (:func:`_asked`)."""
    if ref is not None:
        return list(_asked(ref))
    return sorted(_usable(SOURCES.names()), key=lambda s: (s.priority, s.name))


def _asked(ref: DatasetRef, plugins: bool | None = None) -> Iterator[DatasetSource]:
    """The sources the lookup asks about ``ref``, in order: the built-in ones (those registered in the process) by
    priority, leaving out those whose declaration says they cannot claim it (tasks/datasets/declared.py: not
    imported); then, only if none of them claimed it, the plugins' sources by priority. So a name clipcache knows
    keeps its meaning, and resolving it neither reads the entry points nor imports a plugin's module.
    ``plugins``: only the built-in sources (False) or only the plugins' (True)."""
    if plugins is not True:
        own = [name for name in SOURCES.own_names() if declared(name).may_claim(ref)]
        yield from sorted(_usable(own, plugins=False), key=lambda s: (s.priority, s.name))
    if plugins is not False:
        yield from sorted(_usable(_plugin_names()), key=lambda s: (s.priority, s.name))


def _plugin_names() -> list[str]:
    """The sources other packages add (the entry points, read once per process on first call)."""
    return [name for name in SOURCES.names() if SOURCES.origin(name) != "clipcache"]


def _claimant(ref: DatasetRef, *, image_data: bool = False, plugins: bool | None = None) -> DatasetSource | None:
    """The first source, in the lookup's order (:func:`_asked`), that claims ``ref`` (with ``image_data``, only
    sources of image datasets)."""
    for source in _asked(ref, plugins):
        if not (image_data and source.only_for) and _ask(source, partial(source.claims, ref), False):
            return source
    return None


def known_names() -> list[str]:
    """The names the sources suggest for a typo (a built-in source's declared names are read without importing
    it; a folder-only source has none)."""
    names: list[str] = []
    for source in SOURCES.names():
        spec = declared(source)
        if spec.folder_only:
            continue
        if spec.names is not None:
            names += spec.known_names()
        else:
            names += [n for s in _usable([source]) for n in _ask(s, s.known_names, list[str]())]
    return list(dict.fromkeys(names))


def dataset_catalog() -> list[DatasetRecord]:
    """One record per dataset name (or pattern of names) that the lookup resolves, from the sources it asks, in
    their order: what ``clipcache datasets`` lists. A name several sources read is one record naming them all."""
    return merge_records(_with_origin(source, record) for source in sources_by_priority()
                         for record in _ask(source, source.records, list[DatasetRecord]()))


def record_of(name: str) -> DatasetRecord:
    """The catalog's record of ``name``; a name of a family no list holds (``mieb:CIFAR10ZeroShot``) gets its
    source's pattern record under its own name. A name no source claims is the "Did you mean" error."""
    records = dataset_catalog()
    for record in records:
        if record.name == name:
            return record
    source = _claimant(DatasetRef(name))
    pattern = next((r for r in records if r.is_pattern and source is not None and source.name in r.sources), None)
    if pattern is None:
        raise _unknown(name)
    return replace(pattern, name=name)


def _with_origin(source: DatasetSource, record: DatasetRecord) -> DatasetRecord:
    """A plugin source's record names the package that adds it (its entry point)."""
    origin = SOURCES.origin(source.name)
    return record if origin == "clipcache" or record.origin != "clipcache" else replace(record, origin=origin)


def _unknown(name: str) -> DatasetError:
    import difflib

    close = difflib.get_close_matches(name, known_names(), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else " Use wds/<name> with --dataset_root for a local " \
                                                               "webdataset folder, or custom with a data_dir."
    broken = broken_sources()
    skipped = f" (Not asked: {'; '.join(broken)})" if broken else ""
    return DatasetError(f"Unknown dataset {name!r}.{hint}{skipped}")


def check_name(name: str, dataset_root: str | None = None) -> None:
    """Raise a "Did you mean" error for a name no source claims (before any work starts). Any name of a BEIR folder
    goes (text retrieval). A name some source claims without a root is known whatever the root: the root is read
    only for names no source knows without one. The plugins' sources are asked only when no built-in one claims
    the name, with or without the root."""
    refs = (DatasetRef(name), DatasetRef(name, dataset_root))
    if all(_claimant(ref, plugins=plugins) is None for plugins in (False, True) for ref in refs):
        raise _unknown(name)


def default_task(name: str, dataset_root: str | None) -> str:
    """The task a dataset is evaluated with under ``--task auto``, found without indexing it: its source's (a BEIR
    folder is text retrieval, a reader declares its task, a webdataset folder says in dataset_type.txt, the catalog
    and layouts.json say for their names)."""
    from clipcache.tasks.datasets.sources import webdataset_task

    ref = DatasetRef(name, dataset_root)
    source = _claimant(ref)
    return source.task(ref) if source is not None else webdataset_task(ref.root, ref.bare)


def open_dataset(name: str, dataset_root: str | None, split: str, limit: int | None, *, hub: str = "huggingface",
                 cache_dir: str | None = None, offline: bool = False, progress: Any = None,
                 language: str = "en", annotation_file: str | None = None) -> EvalDataset:
    """Index an image dataset from the first source that claims it. Hosted names without ``dataset_root`` are fetched
    from ``hub`` into ``cache_dir`` first. ``language`` reaches the readers that take it (files that differ by
    language, e.g. Flickr's ``_zh`` captions); ``annotation_file`` replaces a caption dataset's default annotation file
    (clip_benchmark's --annotation_file)."""
    ref = DatasetRef(name, dataset_root)
    source = _claimant(ref, image_data=True)
    if source is None:
        raise _unknown(name)
    options = OpenOptions(hub=hub, cache_dir=cache_dir, offline=offline, progress=progress, language=language,
                          annotation_file=annotation_file)
    dataset: EvalDataset = source.open(ref, split, limit, options)
    return dataset
