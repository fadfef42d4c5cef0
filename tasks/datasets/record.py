"""One typed record per dataset name: what the catalog (``clipcache.tasks.datasets.dataset_catalog``) and
``clipcache datasets`` say about it.

Every record comes from the dataset source that resolves the name (tasks/datasets/source.py, ``records``), so the
listing and the lookup cannot disagree: a name is listed when, and as, a source claims it. A name that several
sources read (``imagenet1k``: its original layout under --dataset_root, else the hosted webdataset) is one record
whose ``sources`` are in the order the lookup asks them. A family that no list of names can hold (``mieb:<task>``,
a BEIR folder under any name) is one pattern record (``name`` with ``<...>``).

Light on purpose: naming and listing datasets imports no numpy, torch or reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

# The metric a dataset of each task is usually ranked by (a suite made from a clip_benchmark collection uses it;
# a suite file may name another per dataset, as DataComp's does).
TASK_MAIN_METRIC = {"zeroshot_classification": "acc1", "zeroshot_retrieval": "mean_recall@1",
                    "image_caption_selection": "acc", "text_retrieval": "ndcg@10", "any2any_retrieval": "ndcg@10",
                    "linear_probe": "lp_acc1", "image_clustering": "image_clustering_nmi",
                    "visual_sts": "cosine_spearman", "multiple_choice": "acc1"}


@dataclass(frozen=True)
class DatasetRecord:
    """What clipcache knows about one dataset name (or one pattern of names) without reading its data."""

    name: str  # as --dataset takes it; a pattern holds <...>: "mieb:<mteb task name>", "wds/<name>", "<name>"
    task: str  # what --task auto evaluates it with; "" where the data decide (dataset_type.txt) or it is not read
    sources: tuple[str, ...] = ()  # the dataset sources (SOURCES) that read it, in lookup order; () = not read
    layouts: tuple[str, ...] = ()  # what it is read from: its files under --dataset_root (first: the original)
    hosted: str = ""  # the hub repository it is downloaded from without --dataset_root
    languages: tuple[str, ...] = ()  # of its class names or captions; () = not declared (English)
    splits: tuple[str, ...] | None = None  # None: any split the files hold
    main_metric: str = ""  # the metric it is usually ranked by ("" for tasks without a usual one)
    licence: str = ""  # as a real source states it (facts_from); "" where none does. Filled on demand, not by the
    citation: str = ""  # sources: tasks/datasets/citations.py reads them from mteb (a BibTeX entry)
    reference: str = ""  # the dataset's paper or page, from the same source
    facts_from: str = ""  # where licence, citation and reference were read ("mteb 2.26.24 TaskMetadata of CIFAR10")
    note: str = ""  # a short remark the listing shows beside the name ("Chinese")
    origin: str = "clipcache"  # the package that adds it (a plugin's entry point)
    family: str = field(default="", compare=False)  # the prefix that groups it: "wilds", "mieb", "vtab", ...

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", family_of(self.name))
        if not self.main_metric and self.task in TASK_MAIN_METRIC:
            object.__setattr__(self, "main_metric", TASK_MAIN_METRIC[self.task])

    @property
    def is_pattern(self) -> bool:
        return "<" in self.name

    @property
    def readable(self) -> bool:
        return bool(self.sources)

    def merged(self, other: DatasetRecord) -> DatasetRecord:
        """This record with what ``other`` (the same name, from a source asked later) adds."""
        return replace(self, sources=_union(self.sources, other.sources), layouts=_union(self.layouts, other.layouts),
                       hosted=self.hosted or other.hosted, languages=self.languages or other.languages,
                       splits=self.splits if self.splits is not None else other.splits,
                       task=self.task or other.task, note=self.note or other.note,
                       licence=self.licence or other.licence, citation=self.citation or other.citation,
                       reference=self.reference or other.reference, facts_from=self.facts_from or other.facts_from)


def family_of(name: str) -> str:
    """``wilds/iwildcam`` -> ``wilds``, ``mieb:CIFAR10ZeroShot`` -> ``mieb``, ``vtab_dtd`` -> ``vtab``, a folder
    format under any name (``<name>``) -> ``folder``, else the name."""
    if name.startswith("<"):
        return "folder"
    for sep in (":", "/"):
        if sep in name:
            return name.split(sep, 1)[0]
    return "vtab" if name.startswith("vtab_") else name


def merge_records(records: Iterable[DatasetRecord]) -> list[DatasetRecord]:
    """One record per name, in first-seen order. Patterns merge only with the same task: ``<name>`` is a BEIR folder
    for text_retrieval and a ViDoRe folder for visual_document_retrieval, two records."""
    out: dict[tuple[str, str], DatasetRecord] = {}
    for record in records:
        key = (record.name, record.task if record.is_pattern else "")
        out[key] = out[key].merged(record) if key in out else record
    return list(out.values())


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*a, *b)))
