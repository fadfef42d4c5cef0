"""Catalog of the metrics we report: flat names (as clip_benchmark/evalscope JSON writes them) <-> long format.

Long format keeps ``k`` as its own column: ``acc5`` -> (``acc``, 5); ``image_retrieval_recall@10`` ->
(``image_retrieval_recall``, 10). Every metric declares its direction.

Every metric is declared where it is reported: each task declares all it reports (``EvalTask.metrics``), the
suites' group metrics are declared with the group rules (``clipcache.tasks.suites.group_metrics``), the face
attributes' with their task, and ``skipped_images`` as a metric of every run (``EvalTask``'s ``RUN_METRICS``). The
catalog a result is written with is derived from those declarations (``clipcache.tasks.evaluation.metric_catalog``,
merged by :func:`merge_declarations`); this module holds no table of them, only the definitions several tasks share
(``RANKING_METRICS``) and the names derived from declared ones (per-group face and selection metrics, mteb's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clipcache.storage.errors import ConfigError


@dataclass(frozen=True)
class MetricInfo:
    name: str
    higher_is_better: bool
    has_k: bool
    definition: str


# The ranked-retrieval metrics over judged documents (tasks/score/text_retrieval.py: per_query_metrics), one
# definition that text_retrieval, any2any_retrieval (and visual_document_retrieval) and composed_retrieval declare.
RANKING_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("ndcg", True, True, "text retrieval: nDCG@k with qrels scores as gains (trec_eval ndcg_cut)"),
    MetricInfo("map", True, True, "text retrieval: mean average precision cut at k (trec_eval map_cut)"),
    MetricInfo("recall", True, True, "text retrieval: relevant docs within k / relevant docs"),
    MetricInfo("precision", True, True, "text retrieval: relevant docs within k / k"),
    MetricInfo("mrr", True, True, "text retrieval: 1 / rank of the first relevant doc within k, else 0"),
)


def merge_declarations(declared: Iterable[tuple[str, MetricInfo]]) -> dict[str, tuple[MetricInfo, list[str]]]:
    """One catalog entry per metric name from (declarer, metric) pairs: the metric and who declares it. A name
    several declare must agree on direction and k; their definitions, where they differ (``acc`` is a classifier's
    top-k accuracy, a selection's group score and a multiple-choice accuracy), are joined as ``declarer: ...``
    clauses in declaration order."""
    grouped: dict[str, list[tuple[str, MetricInfo]]] = {}
    for owner, info in declared:
        grouped.setdefault(info.name, []).append((owner, info))
    merged: dict[str, tuple[MetricInfo, list[str]]] = {}
    for name, entries in grouped.items():
        first_owner, first = entries[0]
        for owner, info in entries[1:]:
            if (info.higher_is_better, info.has_k) != (first.higher_is_better, first.has_k):
                raise ConfigError(f"{owner} declares metric {name!r} with higher_is_better={info.higher_is_better}, "
                                  f"has_k={info.has_k}, unlike {first_owner} ({first.higher_is_better}, "
                                  f"{first.has_k}): one metric name has one direction and one k")
        definitions: dict[str, list[str]] = {}
        for owner, info in entries:
            definitions.setdefault(info.definition, []).append(owner)
        definition = next(iter(definitions)) if len(definitions) == 1 else "; ".join(
            f"{', '.join(owners)}: {text}" for text, owners in definitions.items())
        merged[name] = (MetricInfo(name, first.higher_is_better, first.has_k, definition),
                        list(dict.fromkeys(owner for owner, _ in entries)))
    return merged


_AT_K = re.compile(r"^(?P<metric>[a-z_]+)@(?P<k>\d+)$")
_ACC_K = re.compile(r"^(?P<metric>(lp_)?acc)(?P<k>\d+)$")  # acc5 / lp_acc5: clip_benchmark's names
# mieb:<task> (tasks/evaluation/mieb_runner.py): mteb's own scores, named as mteb names them, ndcg_at_10 -> k = 10
_MTEB = re.compile(r"^(?P<metric>mteb_[a-z0-9_]+?)(_at_(?P<k>\d+))?$")


def mteb_metric(name: str, has_k: bool) -> MetricInfo:
    return MetricInfo(name, "rank" not in name, has_k, f"mieb: mteb's own {name.removeprefix('mteb_')} as its "
                                                       f"evaluator reports it for the task (main_score: the task's "
                                                       f"main score)")


# a face-attribute metric within a group of faces: <metric>_<field>:<code>[_<field>:<code>...], WILDS' names, where
# <metric>_avg is a declared metric (tasks/evaluation/face_attributes.py)
_FACE_GROUP = re.compile(r"^(?P<metric>[a-z_]+?)_(?P<group>[a-z_]+:\d+(_[a-z_]+:\d+)*)$")


def face_group_metric(name: str, known: Mapping[str, MetricInfo]) -> MetricInfo | None:
    """The per-group value of a face-attribute metric (``acc_race_race_binary:0``), or None when ``name`` is none:
    its metric is the longest prefix whose ``<prefix>_avg`` is declared (``acc_gender_x`` before ``acc_gender``)."""
    if _FACE_GROUP.match(name) is None:
        return None
    words = name.split("_")
    for cut in range(len(words) - 1, 0, -1):
        metric, group = "_".join(words[:cut]), "_".join(words[cut:])
        overall = known.get(metric + "_avg")
        if overall is not None and re.fullmatch(r"[a-z_]+:\d+(_[a-z_]+:\d+)*", group):
            what = overall.definition.removesuffix(": over all faces")
            return MetricInfo(name, overall.higher_is_better, False, f"{what}: within the named group")
    return None


# image_caption_selection's sub-scores over a named group of items (CREPE's text_acc:complexity_4, VL-CheckList's
# text_acc:color; SelectionDataset.group_metrics)
_SELECTION_GROUP = re.compile(r"^(?P<metric>image_acc|text_acc|acc):(?P<group>[A-Za-z0-9_.-]+)$")


def selection_group_metric(name: str, metric: MetricInfo) -> MetricInfo:
    return MetricInfo(name, True, False, f"{metric.definition}: within the named group of items (its dataset's "
                                         f"reference sub-score)")


def split_metric_name(flat: str, known: Mapping[str, MetricInfo]) -> tuple[MetricInfo, int | None]:
    """(metric, k) of a flat name, the metric looked up in ``known`` (the registered tasks' catalog,
    ``clipcache.tasks.evaluation.metric_catalog``, or one task's); a KeyError for a name it does not hold."""
    if (group := face_group_metric(flat, known)) is not None:
        return group, None
    if m := _SELECTION_GROUP.match(flat):
        return selection_group_metric(flat, known[m["metric"]]), None
    if m := _ACC_K.match(flat):
        return known[m["metric"]], int(m["k"])
    if m := _AT_K.match(flat):
        return known[m["metric"]], int(m["k"])
    if m := _MTEB.match(flat):
        k = int(m["k"]) if m["k"] else None
        return mteb_metric(m["metric"], k is not None), k
    return known[flat], None


def flat_metric_name(metric: str, k: int | None) -> str:
    if k is None:
        return metric
    if metric.startswith("mteb_"):
        return f"{metric}_at_{k}"
    return f"{metric}{k}" if metric in ("acc", "lp_acc") else f"{metric}@{k}"
