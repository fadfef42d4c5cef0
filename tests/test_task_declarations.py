"""A task is one declaration (issue #41): the metric catalog is derived from the metrics each task declares (no
hand-kept table), and the sample rows a task writes are those it declares (``EvalTask.samples``), checked where
results are written and in ``evaluate_one``."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest

from clipcache.storage.errors import ConfigError, ResultsError
from clipcache.storage.results import SAMPLE_SCHEMA
from clipcache.tasks.contract import WRITER_COLUMNS, SampleUnit, sample_rows_problem
from clipcache.tasks.evaluation import BUILTIN_TASKS, get_task, metric_catalog
from clipcache.tasks.evaluation.base import RUN_METRICS
from clipcache.tasks.results import RunInfo, check_declared, metric_rows
from clipcache.tasks.score import metrics as metrics_module
from clipcache.tasks.score.evidence import Evidence
from clipcache.tasks.score.metrics import RANKING_METRICS, MetricInfo, merge_declarations, split_metric_name

from conftest import REPO

# (name, higher_is_better, has_k) of every catalog entry, taken from main before the shared metrics moved onto the
# tasks that report them (METRICS in tasks/score/metrics.py, commit b0e887f): the move changes none
FROZEN_CATALOG = {
    ('Bleu_1', True, False), ('Bleu_2', True, False), ('Bleu_3', True, False), ('Bleu_4', True, False), ('CIDEr', True,
    False), ('F1-macro_all', True, False), ('METEOR', True, False), ('ROUGE_L', True, False), ('SPICE', True, False),
    ('acc', True, True), ('acc_age_avg', True, False), ('acc_age_wg', True, False), ('acc_gender_avg', True, False),
    ('acc_gender_wg', True, False), ('acc_gender_x_avg', True, False), ('acc_gender_x_wg', True, False),
    ('acc_race_avg', True, False), ('acc_race_wg', True, False), ('acc_top5_wg', True, False), ('acc_wg', True, False),
    ('acc_worst_region', True, False), ('acc_worst_year', True, False), ('avg_jaccard_score', True, False),
    ('cirr_avg', True, False), ('clipscore', True, False), ('cosine_pearson', True, False), ('cosine_spearman', True,
    False), ('euclidean_pearson', True, False), ('euclidean_spearman', True, False), ('image_acc', True, False),
    ('image_clustering_ari', True, False), ('image_clustering_nmi', True, False), ('image_retrieval_mean_rank', False,
    False), ('image_retrieval_median_rank', False, False), ('image_retrieval_mrr', True, True),
    ('image_retrieval_ndcg', True, True), ('image_retrieval_recall', True, True), ('jaccard_score_10', True, False),
    ('jaccard_score_10-12', True, False), ('jaccard_score_12', True, False), ('jaccard_score_5', True, False),
    ('jaccard_score_5-6', True, False), ('jaccard_score_6', True, False), ('knn_acc1', True, False),
    ('knn_mean_per_class_recall', True, False), ('lp_acc', True, True), ('lp_mean_per_class_recall', True, False),
    ('macro_acc', True, False), ('manhattan_pearson', True, False), ('manhattan_spearman', True, False), ('map', True,
    True), ('mean_average_precision', True, False), ('mean_per_class_recall', True, False), ('mieb_lp_accuracy', True,
    False), ('mieb_lp_accuracy_std', False, False), ('mieb_lp_ap', True, False), ('mieb_lp_ap_std', False, False),
    ('mieb_lp_ap_weighted', True, False), ('mieb_lp_ap_weighted_std', False, False), ('mieb_lp_f1', True, False),
    ('mieb_lp_f1_std', False, False), ('mieb_lp_f1_weighted', True, False), ('mieb_lp_f1_weighted_std', False, False),
    ('mieb_lp_precision', True, False), ('mieb_lp_precision_std', False, False), ('mieb_lp_precision_weighted', True,
    False), ('mieb_lp_precision_weighted_std', False, False), ('mieb_lp_recall', True, False), ('mieb_lp_recall_std',
    False, False), ('mieb_lp_recall_weighted', True, False), ('mieb_lp_recall_weighted_std', False, False), ('mrr',
    True, True), ('multilabel_accuracy', True, False), ('multilabel_accuracy_std', False, False), ('multilabel_f1',
    True, False), ('multilabel_f1_std', False, False), ('multilabel_hamming', True, False), ('multilabel_hamming_std',
    False, False), ('multilabel_lrap', True, False), ('multilabel_lrap_std', False, False), ('ndcg', True, True),
    ('precision', True, True), ('recall', True, True), ('recall_subset', True, True), ('refclipscore', True, False),
    ('skipped_images', False, False), ('text_acc', True, False), ('text_retrieval_mean_rank', False, False),
    ('text_retrieval_median_rank', False, False), ('text_retrieval_mrr', True, True), ('text_retrieval_ndcg', True,
    True), ('text_retrieval_recall', True, True), ('toxicity_crime_avg', False, False), ('toxicity_crime_wg', False,
    False), ('toxicity_nonhuman_avg', False, False), ('toxicity_nonhuman_wg', False, False),
}


def test_the_catalog_is_the_one_main_had_before_the_move():
    assert {(name, m.higher_is_better, m.has_k) for name, m in metric_catalog().items()} == FROZEN_CATALOG


def test_no_hand_kept_table_of_task_metrics_remains():
    assert not hasattr(metrics_module, "METRICS")
    declared = {m.name for name in BUILTIN_TASKS for m in get_task(name).metrics} | {m.name for m in RUN_METRICS}
    assert declared == set(metric_catalog())


def test_a_shared_name_has_one_direction_and_one_k():
    with pytest.raises(ConfigError) as refused:
        merge_declarations([("a", MetricInfo("x", True, True, "d")), ("b", MetricInfo("x", False, True, "d"))])
    assert str(refused.value) == ("b declares metric 'x' with higher_is_better=False, has_k=True, unlike a (True, "
                                  "True): one metric name has one direction and one k")
    with pytest.raises(ConfigError, match="one direction and one k"):
        merge_declarations([("a", MetricInfo("x", True, True, "d")), ("b", MetricInfo("x", True, False, "d"))])


def test_definitions_merge_one_clause_per_task_and_a_shared_one_stays_one():
    catalog = metric_catalog()
    assert catalog["acc"].definition.split("; ")[0] == ("zeroshot_classification: fraction of samples whose true "
                                                        "class is among the k highest logits")
    assert "image_caption_selection: (no k)" in catalog["acc"].definition
    assert "multiple_choice: (k = 1)" in catalog["acc"].definition
    ndcg = next(m for m in RANKING_METRICS if m.name == "ndcg")
    assert catalog["ndcg"] == ndcg  # text, any2any, visual document and composed retrieval declare the same one
    merged = merge_declarations([("a", ndcg), ("b", ndcg), ("c", MetricInfo("ndcg", True, True, "other"))])
    assert merged["ndcg"][0].definition == f"a, b: {ndcg.definition}; c: other" and merged["ndcg"][1] == ["a", "b", "c"]


def test_group_and_face_names_derive_from_the_declared_metrics():
    catalog = metric_catalog()
    info, k = split_metric_name("acc_gender_x_race:3_gender:1", catalog)  # acc_gender_x, not acc_gender
    assert k is None and info.definition == "gender head accuracy (groups: gender x race): within the named group"
    assert split_metric_name("acc_race_race_binary:0", catalog)[0].higher_is_better
    assert not split_metric_name("toxicity_crime_race:2", catalog)[0].higher_is_better
    with pytest.raises(KeyError):  # no task declares face metrics here
        split_metric_name("acc_race_race_binary:0", metric_catalog(["zeroshot_classification"]))
    assert split_metric_name("acc_wg", metric_catalog(["zeroshot_classification"]))[0].name == "acc_wg"


def experiment(task: str) -> SimpleNamespace:
    return SimpleNamespace(task=task, columns=lambda: {"task": task})


def test_a_metric_the_task_does_not_declare_is_refused_in_one_line():
    run = RunInfo("r1", datetime.now(UTC))
    rows = metric_rows(run, experiment("multiple_choice"), model_fingerprint="f", metrics={"acc1": 0.5,
                       "skipped_images": 2.0}, tied={}, n_samples=4, cache_keys=[])
    assert [(r["metric"], r["k"], r["higher_is_better"]) for r in rows] == [("acc", 1, True),
                                                                           ("skipped_images", None, False)]
    with pytest.raises(ResultsError) as refused:  # another task's metric
        check_declared("multiple_choice", {"acc1": 0.5, "ndcg@10": 0.3}, None)
    assert str(refused.value) == ("task multiple_choice reported metric 'ndcg@10', which it does not declare "
                                  "(EvalTask.metrics)")


def test_every_builtin_task_declares_sample_columns_the_rows_have():
    for name in BUILTIN_TASKS:
        declared = get_task(name).samples
        assert sample_rows_problem(name, declared, [], SAMPLE_SCHEMA.names) is None, name
        assert len({s.unit for s in declared}) == len(declared), name
        assert all(s.meaning and not set(s.columns) & WRITER_COLUMNS for s in declared), name


def test_a_wrong_sample_declaration_is_refused_in_one_line():
    bogus = (SampleUnit("image", ("target", "confidence"), "an image"),)
    assert sample_rows_problem("mine", bogus, [("image", ["target"])], SAMPLE_SCHEMA.names) == (
        "task mine declares sample unit 'image' with column(s) confidence that the sample rows do not have "
        "(SAMPLE_SCHEMA, storage/results.py)")
    writer = (SampleUnit("image", ("run_id",), "an image"),)
    assert sample_rows_problem("mine", writer, [], SAMPLE_SCHEMA.names) == (
        "task mine declares sample unit 'image' with column(s) run_id that the results writer fills itself")
    with pytest.raises(TypeError, match="at most one <placeholder>"):
        SampleUnit("Image <a> <b>", (), "x")
    with pytest.raises(TypeError, match="columns is a tuple"):
        SampleUnit("image", ["target"], "x")  # type: ignore[arg-type]


def test_rows_of_an_undeclared_unit_or_column_are_refused_in_one_line():
    image = Evidence("image", {"sample_index": np.arange(2), "target": np.arange(2)})
    check_declared("zeroshot_classification", {"acc1": 1.0}, image)
    image.more.append(Evidence("image_query", {"sample_index": np.arange(2)}))
    with pytest.raises(ResultsError) as refused:
        check_declared("zeroshot_classification", {"acc1": 1.0}, image)
    assert str(refused.value) == ("task zeroshot_classification wrote sample rows of unit 'image_query' it does not "
                                  "declare (EvalTask.samples: image, class, metadata)")
    wrong = Evidence("image", {"sample_index": np.arange(2), "hits_at": np.zeros((2, 1))})
    with pytest.raises(ResultsError, match=r"wrote column\(s\) hits_at in sample rows of unit 'image', which declares "
                                           r"target, prediction"):
        check_declared("zeroshot_classification", {}, wrong)


def test_a_unit_pattern_matches_one_word():
    caption = SampleUnit("caption_<metric>", ("value",), "x")
    assert caption.matches("caption_cider") and caption.matches("caption_bleu_4")
    assert not caption.matches("caption") and not caption.matches("image_caption_cider")
    assert SampleUnit("image", (), "x").matches("image") and not SampleUnit("image", (), "x").matches("images")


def test_naming_a_declaring_task_imports_no_numpy_or_pyarrow():
    code = ("import json, sys\nfrom clipcache.tasks.evaluation import get_task\n"
            "for name in ('zeroshot_classification', 'face_attributes', 'text_retrieval', 'composed_retrieval'):\n"
            "    get_task(name).samples, get_task(name).metrics\n"
            "print(json.dumps([m for m in ('numpy', 'pyarrow', 'torch') if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """The bundled tiny model, and one cache for every task below (they share the shapes images)."""
    import torch

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.encode.stage import ModelSession
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    return session, EmbeddingStore(tmp_path_factory.mktemp("cache")), memo


@pytest.mark.parametrize(("task", "dataset"), [("zeroshot_classification", "shapes"),
                                               ("zeroshot_retrieval", "shapes_retrieval"),
                                               ("linear_probe", "shapes"), ("knn_classification", "shapes"),
                                               ("image_clustering", "shapes")])
def test_a_task_on_the_bundled_data_fills_exactly_the_columns_it_declares(bundled, task, dataset):
    """evaluate_one refuses rows the task does not declare (every test scoring a task checks that); here the
    declaration is also no looser than the rows: each declared column of a unit written is filled."""
    from clipcache.tasks.evaluation import evaluate_one
    from clipcache.tasks.evaluation.base import DataSource, ScoreSettings

    session, store, memo = bundled
    scored = evaluate_one(task, session, DataSource(dataset, limit=90), store, memo,
                          score=ScoreSettings(recall_k=(1, 5), retrieval_metrics=("recall", "ndcg"), bootstrap=0))
    assert scored.evidence is not None
    for part in scored.evidence.parts():
        [spec] = [s for s in get_task(task).samples if s.matches(part.unit)]
        assert set(part.columns) - {"sample_index"} == set(spec.columns), (task, part.unit)
