"""The metrics DataComp's group rules report (tasks/suites/groups.py computes them over the sample rows and the
per-sample metadata; names as DataComp writes them). zeroshot_classification declares them: it reports them for
the datasets whose layout names a grouping (tasks/datasets/datacomp/group_layouts.json). A light module: naming a
task imports it."""

from __future__ import annotations

from clipcache.tasks.score.metrics import MetricInfo

GROUP_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("F1-macro_all", True, False, "WILDS' macro F1: mean over the classes present in the targets of "
                                            "2 tp / (2 tp + fp + fn) of the argmax"),
    MetricInfo("acc_wg", True, False, "worst-group top-1 accuracy over the dataset's DataComp grouping (groups "
                                      "with samples)"),
    MetricInfo("acc_top5_wg", True, False, "worst-group top-5 accuracy over the dataset's DataComp grouping"),
    MetricInfo("acc_worst_region", True, False, "lowest top-1 accuracy over the regions with samples"),
    MetricInfo("acc_worst_year", True, False, "lowest top-1 accuracy over the years with samples"),
)
