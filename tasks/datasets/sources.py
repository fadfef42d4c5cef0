"""The built-in dataset sources (the contract is tasks/datasets/source.py), in the order the lookups ask them:

====  ===========  ==================================================================================================
  1   mieb         mieb:<mteb task name>: mteb's own task and loader (tasks/datasets/mieb/mieb_tasks.py)
 10   beir         --dataset_root is a BEIR folder (corpus.jsonl + queries.jsonl), any name: text_retrieval
 15   any2any      the same folder read by --task any2any_retrieval (under auto, beir comes first)
 20   registered   a reader in DATASETS: the built-in ones (shapes, custom, imagefolder, winoground, ...) and plugins'
 22   winogavil    misc/winogavil from DataComp's Hugging Face cache of nlphuji/winogavil (datacomp/winogavil.py)
 25   group_layouts  DataComp's WILDS and fairness sets with per-sample metadata (datacomp/group_layouts.py)
 30   original     clip_benchmark's original layouts (layouts.json); a hosted name only with --dataset_root
 40   webdataset   wds/<name>, or a hosted name, with --dataset_root: clip_benchmark's webdataset folder
 50   hosted       a catalog.csv name (or wds/<name>) without --dataset_root: downloaded, then read as webdataset
 59   vidore       ViDoRe's folders (v1 question rows, v2 / MIEB BEIR Parquet): visual_document_retrieval (vidore.py)
 60   visual_sts   MIEB's visual STS folders; 61 multiple_choice: its multiple-choice folders (mieb_layouts.py)
 62   composed     CIRR / FashionIQ / MIEB's composed-query folders (composed_layouts.py); 62 multilabel: VOC 2007's
                   devkit or label-list folders for multilabel_probe (multilabel_layouts.py)
====  ===========  ==================================================================================================

Claims read names and at most a few ``stat`` calls; everything heavier is imported inside ``open``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import DATASETS, catalog, get_reader, original_names, registered_task
from clipcache.tasks.datasets.record import DatasetRecord
from clipcache.tasks.datasets.source import WDS_PREFIX, DatasetRef, DatasetSource, OpenOptions, format_root

if TYPE_CHECKING:
    from clipcache.tasks.datasets.base import EvalDataset


def webdataset_task(root: Path | None, bare: str) -> str:
    """A webdataset folder says its task in dataset_type.txt; else the catalog does; else classification."""
    if root is not None and (root / "dataset_type.txt").is_file():
        kind = (root / "dataset_type.txt").read_text(encoding="utf-8").strip().lower()
        return "zeroshot_retrieval" if kind == "retrieval" else "zeroshot_classification"
    return catalog()[bare]["task"] if bare in catalog() else "zeroshot_classification"


class BeirFolders(DatasetSource):
    name = "beir"
    description = "a BEIR folder as --dataset_root (corpus.jsonl, queries.jsonl, qrels/<split>.tsv), under any name"
    priority = 10
    only_for = ("text_retrieval",)

    def claims(self, ref: DatasetRef) -> bool:
        from clipcache.tasks.datasets.beir import is_beir_folder

        root = ref.root
        return root is not None and is_beir_folder(root)

    def task(self, ref: DatasetRef) -> str:
        return "text_retrieval"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> Any:
        from clipcache.tasks.datasets.beir import open_beir

        return open_beir(ref.name, ref.folder("corpus.jsonl, queries.jsonl and qrels/<split>.tsv"), split, limit)


class Any2AnyFolders(BeirFolders):
    name = "any2any"
    description = "a BEIR folder whose records may be images (\"image\": path), read by --task any2any_retrieval"
    priority = 15
    only_for = ("any2any_retrieval",)

    def task(self, ref: DatasetRef) -> str:
        return "any2any_retrieval"

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> Any:
        from clipcache.tasks.datasets.any2any import open_any2any

        return open_any2any(ref.name, ref.folder("corpus.jsonl, queries.jsonl and qrels/<split>.tsv"), split, limit)


class RegisteredReaders(DatasetSource):
    name = "registered"
    description = "a dataset reader registered by name (DATASETS): built-in or from a plugin"
    priority = 20

    def claims(self, ref: DatasetRef) -> bool:
        return ref.name in DATASETS

    def task(self, ref: DatasetRef) -> str:
        return registered_task(ref.name)

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> EvalDataset:
        import inspect

        root = format_root(ref.dataset_root, ref.name) if ref.dataset_root else None
        reader = get_reader(ref.name)
        takes_language = "language" in inspect.signature(reader).parameters
        return reader(ref.name, root, split, limit, **({"language": options.language} if takes_language else {}))

    def known_names(self) -> list[str]:
        return DATASETS.names()

    def records(self) -> list[DatasetRecord]:
        """A reader says its task and, in its ``description``, its files; a plugin's record names its package."""
        return [DatasetRecord(name, registered_task(name), (self.name,),
                              (getattr(get_reader(name), "description", "") or "your files (--dataset_root)",),
                              origin=DATASETS.origin(name)) for name in DATASETS.names()]


class OriginalLayouts(DatasetSource):
    name = "original"
    description = "clip_benchmark's original files under --dataset_root, as layouts.json describes them"
    priority = 30

    def claims(self, ref: DatasetRef) -> bool:
        """A name only clip_benchmark's builder reads (cifar10, food101, ...) always; a hosted one (imagenet1k,
        flickr30k, ...) with --dataset_root, where its original layout or webdataset shards may be."""
        from clipcache.tasks.datasets.clip_benchmark.layouts import layouts

        return ref.name in layouts() and (ref.name not in catalog() or ref.dataset_root is not None)

    def task(self, ref: DatasetRef) -> str:
        from clipcache.tasks.datasets.clip_benchmark.layouts import task_of

        return task_of(ref.name) if ref.name not in catalog() else webdataset_task(ref.root, ref.name)

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> EvalDataset:
        from clipcache.tasks.datasets.clip_benchmark.layouts import layouts, open_original, present

        name, entry, hosted = ref.name, layouts()[ref.name], ref.name in catalog()
        root = ref.folder(f"{entry['folder']} (files: {entry['source']})")
        if not hosted or present(name, root, split):
            return open_original(name, root, split, limit, language=options.language,
                                 annotation_file=options.annotation_file)
        if options.annotation_file:
            raise DatasetError(f"dataset {name!r}: --annotation_file replaces the caption file of clip_benchmark's "
                               f"original layout, which is not under {root} ({entry['folder']}); a webdataset copy "
                               f"has its captions inside")
        from clipcache.tasks.datasets.clip_benchmark.wds import load_webdataset

        try:
            return load_webdataset(name, root, split, limit)
        except DatasetError as e:
            raise DatasetError(f"{e}; nor is clip_benchmark's original layout there: {entry['folder']} (files: "
                               f"{entry['source']})") from e

    def known_names(self) -> list[str]:
        return original_names()

    def records(self) -> list[DatasetRecord]:
        """Every name of clip_benchmark's builder: those read from their original files (layouts.json), and those
        clipcache does not read, with why (no source)."""
        from clipcache.tasks.datasets.clip_benchmark.layouts import describe, languages_of, layouts, not_read

        read = [DatasetRecord(name, self.task(DatasetRef(name)), (self.name,), (describe(name),),
                              languages=tuple(languages_of(name) or ()),
                              splits=None if entry["splits"] is None else tuple(entry["splits"]))
                for name, entry in sorted(layouts().items())]
        return read + [DatasetRecord(name, "", (), (why,)) for name, why in not_read().items()]


class WebdatasetFolders(DatasetSource):
    name = "webdataset"
    description = "clip_benchmark's webdataset layout under --dataset_root: wds/<name>, or a catalog.csv name"
    priority = 40

    def claims(self, ref: DatasetRef) -> bool:
        return ref.dataset_root is not None and (ref.name.startswith(WDS_PREFIX) or ref.name in catalog())

    def task(self, ref: DatasetRef) -> str:
        return webdataset_task(ref.root, ref.bare)

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> EvalDataset:
        from clipcache.tasks.datasets.clip_benchmark.wds import load_webdataset

        return load_webdataset(ref.name, ref.folder("a webdataset split folder (<split>/nshards.txt)"), split, limit)

    def records(self) -> list[DatasetRecord]:
        """Any folder of clip_benchmark's webdataset layout as wds/<name>; the hosted names' copies (their layout
        is the pattern's, so their records add only this source)."""
        pattern = DatasetRecord(f"{WDS_PREFIX}<name>", "", (self.name,),
                                ("clip_benchmark's webdataset layout: <split>/nshards.txt + <split>/N.tar; the task "
                                 "from dataset_type.txt",))
        return [pattern, *(DatasetRecord(name, row["task"], (self.name,)) for name, row in sorted(catalog().items()))]


class HostedCatalog(DatasetSource):
    name = "hosted"
    description = "a catalog.csv name without --dataset_root: downloaded from the hub into the cache, then read"
    priority = 50

    def claims(self, ref: DatasetRef) -> bool:
        return ref.dataset_root is None and (ref.name.startswith(WDS_PREFIX) or ref.name in catalog())

    def task(self, ref: DatasetRef) -> str:
        return webdataset_task(None, ref.bare)

    def open(self, ref: DatasetRef, split: str, limit: int | None, options: OpenOptions) -> EvalDataset:
        from clipcache.tasks.datasets.clip_benchmark.download import fetch_dataset
        from clipcache.tasks.datasets.clip_benchmark.wds import load_webdataset

        if options.cache_dir is None:
            raise DatasetError(f"dataset {ref.name!r} needs --dataset_root (a local folder in the clip_benchmark "
                               f"webdataset layout) or a cache_dir to download it into")
        root = fetch_dataset(ref.name, split, options.hub, options.cache_dir, offline=options.offline,
                             progress=options.progress)
        return load_webdataset(ref.name, root, split, limit)

    def known_names(self) -> list[str]:
        return sorted(catalog())

    def records(self) -> list[DatasetRecord]:
        from clipcache.tasks.datasets.clip_benchmark.download import repo_name

        wds = DatasetRecord(f"{WDS_PREFIX}<name>", "", (self.name,), hosted=f"clip-benchmark/{repo_name('<name>')}")
        return [wds, *(DatasetRecord(name, row["task"], (self.name,), hosted=f"clip-benchmark/{repo_name(name)}",
                                     note=row.get("notes") or "") for name, row in sorted(catalog().items()))]
