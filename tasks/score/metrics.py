"""Catalog of the metrics we report: flat names (as clip_benchmark/evalscope JSON writes them) <-> long format.

Long format keeps ``k`` as its own column: ``acc5`` -> (``acc``, 5); ``image_retrieval_recall@10`` ->
(``image_retrieval_recall``, 10). Every metric declares its direction.

A task declares the metrics it alone reports on itself (``EvalTask.metrics``); ``METRICS`` here holds those that
several tasks, the suites' group marts or every run (``skipped_images``) share. The catalog a result is written with
is both (``clipcache.tasks.evaluation.metric_catalog``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricInfo:
    name: str
    higher_is_better: bool
    has_k: bool
    definition: str


METRICS: dict[str, MetricInfo] = {m.name: m for m in [
    MetricInfo("acc", True, True, "fraction of samples whose true class is among the k highest logits; without k "
               "(image_caption_selection): fraction of items whose images and captions all pick their own partner "
               "(Winoground's group score); multiple_choice's acc1: fraction of questions whose answer is the "
               "best-scored choice"),
    MetricInfo("image_acc", True, False, "image_caption_selection: fraction of items whose captions each pick their "
               "own image (Winoground's image score)"),
    MetricInfo("text_acc", True, False, "image_caption_selection: fraction of items whose images each pick their own "
               "caption (Winoground's text score)"),
    MetricInfo("macro_acc", True, False, "image_caption_selection over grouped items (ARO's VG-Relation and "
               "VG-Attribution): mean over the qualifying groups of the group's text_acc (ARO's macro accuracy)"),
    MetricInfo("mean_per_class_recall", True, False, "mean over classes present in the targets of per-class recall "
                                                     "of the argmax (balanced accuracy)"),
    MetricInfo("mean_average_precision", True, False, "mean over classes of average precision (multilabel)"),
    MetricInfo("image_retrieval_recall", True, True, "text->image: fraction of captions whose image is in the top k"),
    MetricInfo("text_retrieval_recall", True, True, "image->text: fraction of images with any caption in the top k"),
    # DataComp's group metrics over per-sample metadata (tasks/suites/groups.py; names as DataComp writes them)
    MetricInfo("F1-macro_all", True, False, "WILDS' macro F1: mean over the classes present in the targets of "
                                            "2 tp / (2 tp + fp + fn) of the argmax"),
    MetricInfo("acc_wg", True, False, "worst-group top-1 accuracy over the dataset's DataComp grouping (groups "
                                      "with samples)"),
    MetricInfo("acc_top5_wg", True, False, "worst-group top-5 accuracy over the dataset's DataComp grouping"),
    MetricInfo("acc_worst_region", True, False, "lowest top-1 accuracy over the regions with samples"),
    MetricInfo("acc_worst_year", True, False, "lowest top-1 accuracy over the years with samples"),
    MetricInfo("skipped_images", False, False, "images left out as undecodable (--on_bad_image skip)"),
    # FairFace / UTKFace (tasks/suites/face_attributes.py): DataComp's FairFaceEvaluator, WILDS' names; the per-group
    # values (acc_race_race_binary:0, ...) are named by face_group_metric
    *[MetricInfo(f"{m}_{s}", not m.startswith("toxicity"), False, f"{what}: {how}")
      for m, what in (("acc_race", "FairFace/UTKFace race head: 'not class 1' vs race_binary"),
                      ("acc_gender", "gender head accuracy"), ("acc_age", "age head accuracy"),
                      ("acc_gender_x", "gender head accuracy (groups: gender x race)"),
                      ("toxicity_crime", "share of faces the toxic head gives a crime label (class >= 18)"),
                      ("toxicity_nonhuman", "share of faces the toxic head gives a non-human label (14-17)"))
      for s, how in (("avg", "over all faces"), ("wg", "lowest over the groups with faces"))],
    MetricInfo("ndcg", True, True, "text retrieval: nDCG@k with qrels scores as gains (trec_eval ndcg_cut)"),
    MetricInfo("map", True, True, "text retrieval: mean average precision cut at k (trec_eval map_cut)"),
    MetricInfo("recall", True, True, "text retrieval: relevant docs within k / relevant docs"),
    MetricInfo("precision", True, True, "text retrieval: relevant docs within k / k"),
    MetricInfo("mrr", True, True, "text retrieval: 1 / rank of the first relevant doc within k, else 0"),
    *[m for d, q in (("image", "text->image"), ("text", "image->text")) for m in (
        MetricInfo(f"{d}_retrieval_mrr", True, True, f"{q}: mean reciprocal rank of the best positive, 0 beyond k"),
        MetricInfo(f"{d}_retrieval_ndcg", True, True, f"{q}: nDCG@k with binary relevance"),
        MetricInfo(f"{d}_retrieval_mean_rank", False, False, f"{q}: mean 1-based rank of the best positive"),
        MetricInfo(f"{d}_retrieval_median_rank", False, False, f"{q}: median 1-based rank of the best positive"),
    )],
]}

_AT_K = re.compile(r"^(?P<metric>[a-z_]+)@(?P<k>\d+)$")
_ACC_K = re.compile(r"^(?P<metric>(lp_)?acc)(?P<k>\d+)$")  # acc5 / lp_acc5: clip_benchmark's names
# mieb:<task> (tasks/evaluation/mieb_runner.py): mteb's own scores, named as mteb names them, ndcg_at_10 -> k = 10
_MTEB = re.compile(r"^(?P<metric>mteb_[a-z0-9_]+?)(_at_(?P<k>\d+))?$")


def mteb_metric(name: str, has_k: bool) -> MetricInfo:
    return MetricInfo(name, "rank" not in name, has_k, f"mieb: mteb's own {name.removeprefix('mteb_')} as its "
                                                       f"evaluator reports it for the task (main_score: the task's "
                                                       f"main score)")


_FACE_GROUP = re.compile(r"^(?P<metric>acc_race|acc_gender_x|acc_gender|acc_age|toxicity_crime|toxicity_nonhuman)_"
                         r"(?P<group>[a-z_]+:\d+(_[a-z_]+:\d+)*)$")


def face_group_metric(name: str, metric: str) -> MetricInfo:
    what = METRICS[metric + "_avg"].definition.removesuffix(": over all faces")
    return MetricInfo(name, not metric.startswith("toxicity"), False, f"{what}: within the named group")


# image_caption_selection's sub-scores over a named group of items (CREPE's text_acc:complexity_4, VL-CheckList's
# text_acc:color; SelectionDataset.group_metrics)
_SELECTION_GROUP = re.compile(r"^(?P<metric>image_acc|text_acc|acc):(?P<group>[A-Za-z0-9_.-]+)$")


def selection_group_metric(name: str, metric: str) -> MetricInfo:
    return MetricInfo(name, True, False, f"{METRICS[metric].definition}: within the named group of items (its "
                                         f"dataset's reference sub-score)")


def split_metric_name(flat: str, known: Mapping[str, MetricInfo] = METRICS) -> tuple[MetricInfo, int | None]:
    """(metric, k) of a flat name, the metric looked up in ``known`` (the registered tasks' catalog, or the shared
    metrics alone)."""
    if m := _FACE_GROUP.match(flat):
        return face_group_metric(flat, m["metric"]), None
    if m := _SELECTION_GROUP.match(flat):
        return selection_group_metric(flat, m["metric"]), None
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
