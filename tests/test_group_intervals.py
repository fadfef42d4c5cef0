"""Bootstrap intervals of DataComp's group metrics (issue #27): worst-group accuracy, worst top-5, macro F1 and the
FairFace / UTKFace head metrics, each recomputed on index resamples of the samples. The point estimate on the full
sample equals the NumPy and SQL values; the bootstrap draws equal a brute-force loop that recomputes the metric
with the existing NumPy functions on explicit resampled index arrays drawn with the same seed; the metric rows
carry the intervals, and a suite whose main metrics are group metrics gets an interval."""

from __future__ import annotations

import group_reference as reference
import numpy as np
import pytest
from sklearn.metrics import f1_score
from test_fairface import FIELDS, HAND_CODES, HAND_PREDICTIONS, hand_metadata, write_face_copy
from test_group_metrics import (
    CORRECT5,
    PREDICTION,
    REGION,
    TARGET,
    hand_warehouse,
    read_copy_by_hand,
    write_datacomp_copy,
)

from clipcache import connect
from clipcache.storage.sample_metadata import SampleMetadata
from clipcache.tasks.datasets.datacomp.group_layouts import group_layouts
from clipcache.tasks.score.intervals import (
    DEFAULT_RESAMPLES,
    macro_f1_statistic,
    paired_draws,
    percentile_interval,
    worst_group_statistic,
)
from clipcache.tasks.suites import Suite, SuiteEntry, face_attributes, groups, load_suite
from clipcache.tasks.suites.face_attributes import face_draws
from clipcache.tasks.suites.scoring import _seed, score_suite


def explicit_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """The index resamples as an explicit (resamples, n) array: one call of the seeded generator (what the
    bootstrap draws when resamples x n fits one block)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n), dtype=np.int32)


def brute_force(metric, n: int, resamples: int, seed: int) -> np.ndarray:
    """``metric(index vector)`` on each explicit resample, one Python call per resample."""
    return np.array([metric(row) for row in explicit_indices(n, resamples, seed)], dtype=np.float64)


def synthetic(n: int = 240, classes: int = 9, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    target = rng.integers(0, classes, n)
    prediction = np.where(rng.random(n) < 0.6, target, rng.integers(0, classes + 2, n))  # some never-a-label classes
    region = rng.choice([0, 1, 4, 7], size=n, p=[0.5, 0.3, 0.17, 0.03])  # group 7 is rare: missing from resamples
    return {"sample_index": np.arange(n), "target": target, "prediction": prediction,
            "correct1": (prediction == target).astype(float), "correct5": (rng.random(n) < 0.8).astype(float),
            "region": region}


# -- the statistics on synthetic data --------------------------------------------------------------------------------

def test_point_estimates_equal_numpy_and_sklearn():
    s = synthetic()
    identity = np.arange(len(s["target"]))[None, :]
    f1 = macro_f1_statistic(s["target"], s["prediction"])(identity)[0]
    assert f1 == pytest.approx(reference.macro_f1(s["target"], s["prediction"]), abs=1e-15)
    assert f1 == pytest.approx(f1_score(s["target"], s["prediction"], average="macro",
                                        labels=np.unique(s["target"])), abs=1e-15)
    for column in ("correct1", "correct5"):
        worst = worst_group_statistic(s[column], s["region"])(identity)[0]
        assert worst == reference.worst_group(s[column], s["region"])
    # the hand case of test_group_metrics: 32/45 and the tie of groups 0 and 3 at 0.5
    hand = np.arange(6)[None, :]
    assert macro_f1_statistic(TARGET, PREDICTION)(hand)[0] == pytest.approx(32 / 45, abs=1e-15)
    assert worst_group_statistic(PREDICTION == TARGET, REGION)(hand)[0] == 0.5
    assert worst_group_statistic(CORRECT5, REGION)(hand)[0] == 0.5


@pytest.mark.parametrize("seed", [0, 11])
def test_bootstrap_draws_equal_a_brute_force_loop(seed):
    s = synthetic()
    n, resamples = len(s["target"]), 400
    cases = [
        (macro_f1_statistic(s["target"], s["prediction"]),
         lambda row: reference.macro_f1(s["target"][row], s["prediction"][row])),
        (worst_group_statistic(s["correct1"], s["region"]),
         lambda row: reference.worst_group(s["correct1"][row], s["region"][row])),
        (worst_group_statistic(s["correct5"], s["region"]),
         lambda row: reference.worst_group(s["correct5"][row], s["region"][row])),
    ]
    for statistic, metric in cases:
        expected = brute_force(metric, n, resamples, seed)
        assert np.allclose(paired_draws(statistic, n, resamples=resamples, seed=seed), expected, rtol=0, atol=1e-12)
    # the rare group (7) is missing from some resamples: those take the minimum over the groups present
    missing = [(row == 7).sum() == 0 for row in (s["region"][r] for r in explicit_indices(n, resamples, seed))]
    assert any(missing)


def test_the_suite_scorer_and_the_metric_rows_draw_the_same_statistics():
    """attach(): the intervals in the evidence are the percentile intervals of the brute-force draws (seed 0)."""
    from clipcache.tasks.score.evidence import classification_evidence

    s = synthetic(n=60, classes=5)
    name = "fairness/geode"
    fields = group_layouts()[name]["fields"]
    metadata = SampleMetadata(name, "test", "hand", [f"k{i}" for i in range(60)],
                              {f: s["region"].copy() for f in fields})
    samples = {k: s[k] for k in ("sample_index", "target", "prediction", "correct1", "correct5")}
    evidence = classification_evidence(samples, 5, resamples=300)
    metrics = groups.attach(evidence, {}, name, metadata, samples, resamples=300)
    expected = brute_force(lambda row: reference.worst_group(s["correct1"][row], s["region"][row]), 60, 300, 0)
    assert metrics["acc_wg"] == reference.worst_group(s["correct1"], s["region"])
    assert evidence.all_intervals()["acc_wg"] == pytest.approx(percentile_interval(expected), abs=1e-12)
    no_interval = classification_evidence(samples, 5, resamples=0)
    groups.attach(no_interval, {}, name, metadata, samples, resamples=0)
    assert "acc_wg" not in no_interval.all_intervals()


def face_case(n: int = 150, seed: int = 2) -> tuple[SampleMetadata, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    race = rng.choice(7, size=n, p=[0.3, 0.3, 0.2, 0.1, 0.05, 0.04, 0.01])
    codes = {"age": rng.integers(0, 9, n), "gender": rng.integers(0, 2, n), "race": race,
             "race_binary": (race != 1).astype(np.int64)}
    metadata = SampleMetadata("fairness/fairface", "test", "hand", [f"f{i}" for i in range(n)], codes)
    gender = np.where(rng.random(n) < 0.7, codes["gender"], 1 - codes["gender"])
    predictions = {"race": rng.integers(0, 7, n), "gender": gender, "age": rng.integers(0, 9, n),
                   "toxic": rng.integers(0, 20, n)}
    return metadata, np.arange(n), predictions


def test_face_draws_equal_face_metrics_on_each_explicit_resample():
    metadata, positions, predictions = face_case()
    n, resamples = len(positions), 200
    drawn = face_draws("fairness/fairface", positions, predictions, metadata, resamples=resamples, seed=4)
    full = reference.face_metrics("fairness/fairface", positions, predictions, metadata)
    # the package's own numbers (the SQL the warehouse runs) are the brute-force loop's
    assert face_attributes.face_metrics("fairness/fairface", positions, predictions, metadata) == \
        pytest.approx(full, abs=1e-12)
    assert set(drawn) == set(full)
    brute = [reference.face_metrics("fairness/fairface", positions[row], {h: p[row] for h, p in predictions.items()},
                          metadata) for row in explicit_indices(n, resamples, 4)]
    for metric, values in drawn.items():
        expected = np.array([b.get(metric, np.nan) for b in brute])  # a group a resample misses: no value
        assert np.allclose(values, expected, rtol=0, atol=1e-12, equal_nan=True), metric
    rare = [m for m in drawn if m.startswith("acc_gender_x_race:5")]  # race 5: 4% of the faces, two genders
    assert rare and any(np.isnan(drawn[m]).any() for m in rare)  # a group some resamples miss


def test_face_worst_group_point_estimate_equals_the_hand_values():
    metadata = hand_metadata()
    for spec in group_layouts()["fairness/fairface"]["head_metrics"]:
        truth = metadata.codes[spec["truth"]] if spec.get("truth") else None
        values = reference.outcome(spec, HAND_PREDICTIONS[spec["head"]], truth)
        keys = np.stack([HAND_CODES[:, FIELDS.index(f)] for f in spec["by"]], axis=1)
        worst = worst_group_statistic(values, keys)(np.arange(4)[None, :])[0]
        hand = reference.face_metrics("fairness/fairface", np.arange(4), HAND_PREDICTIONS, metadata)
        assert worst == hand[f"{spec['metric']}_wg"]


@pytest.mark.parametrize("name, metric", [("fairness/geode", "acc_wg"), ("fairness/dollar_street", "acc_top5_wg"),
                                          ("wilds/iwildcam", "F1-macro_all")])
def test_point_estimate_equals_the_sql_view(name, metric):
    fields = group_layouts()[name]["fields"]
    metadata = SampleMetadata(name, "test", "hand", [f"k{i}" for i in range(6)], {f: REGION.copy() for f in fields})
    in_sql = dict(hand_warehouse(metadata).execute("SELECT metric, value FROM group_metrics").fetchall())
    samples = {"sample_index": np.arange(6), "target": TARGET, "prediction": PREDICTION,
               "correct1": (PREDICTION == TARGET).astype(float), "correct5": CORRECT5.astype(float)}
    statistic = groups.group_statistics(name, samples, metadata)[metric]
    assert statistic(np.arange(6)[None, :])[0] == pytest.approx(in_sql[metric], abs=1e-15)


# -- end to end: metric rows, SQL views and a suite -------------------------------------------------------------------

GROUP_SETS = {"wilds/iwildcam": "F1-macro_all", "wilds/fmow": "acc_worst_region",
              "fairness/dollar_street": "acc_top5_wg", "fairness/geode": "acc_wg"}


def evaluate_group_sets(base):
    """The four DataComp group sets (synthetic copies, 36 images) and FairFace (40 faces) evaluated with the
    bundled model; returns {dataset: what was written}."""
    from clipcache.flows.cli import main

    written = {name: write_datacomp_copy(base / "data" / name.replace("/", "-"), name, 36, seed=i)
               for i, name in enumerate(GROUP_SETS)}
    written["fairness/fairface"] = write_face_copy(base / "data" / "fairness-fairface", 40, seed=0)
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", *written, "--output_dir", str(base / "out"),
                 "--cache_dir", str(base / "cache"), "--quiet", "--orchestrator", "local", "--dataset_root",
                 str(base / "data" / "{dataset_cleaned}")]) == 0
    return written


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    base = tmp_path_factory.mktemp("group-intervals")
    return base, evaluate_group_sets(base)


def image_rows(con, dataset: str) -> tuple[str, dict[str, np.ndarray]]:
    experiment = con.execute("SELECT DISTINCT experiment_id FROM leaderboard WHERE dataset = ?",
                             [dataset]).fetchone()[0]
    rows = con.execute("SELECT sample_index, sample_key, target, prediction, correct1, correct5 FROM latest_samples "
                       "WHERE experiment_id = ? AND unit = 'image' ORDER BY sample_index", [experiment]).fetchall()
    names = ("sample_index", "sample_key", "target", "prediction", "correct1", "correct5")
    return experiment, {k: np.array(v) for k, v in zip(names, zip(*rows, strict=True), strict=True)}


def reference_metric(dataset: str, metric: str, samples: dict[str, np.ndarray], copy: dict):
    """``row -> the metric on that resample`` with the NumPy functions, the groups read from the tar files."""
    kind, by = groups.definition(dataset, metric)
    if kind == "macro_f1":
        target, prediction = samples["target"].astype(int), samples["prediction"].astype(int)
        return lambda row: reference.macro_f1(target[row], prediction[row])
    fields = group_layouts()[dataset]["fields"]
    codes = np.array([copy[k][1][fields.index(by)] for k in samples["sample_key"]])
    correct = samples["correct1" if kind == "worst_acc1" else "correct5"].astype(float)
    return lambda row: reference.worst_group(correct[row], codes[row])


@pytest.mark.parametrize("dataset", list(GROUP_SETS))
def test_metric_rows_carry_the_brute_force_interval(evaluated, dataset):
    base, _ = evaluated
    con = connect(str(base / "out"))
    experiment, samples = image_rows(con, dataset)
    copy = read_copy_by_hand(base / "data" / dataset.replace("/", "-"))
    in_sql = dict(con.execute("SELECT metric, value FROM group_metrics WHERE experiment_id = ?",
                              [experiment]).fetchall())
    rows = {m: (v, lo, hi) for m, v, lo, hi in con.execute(
        "SELECT metric, value, ci_low, ci_high FROM metrics WHERE experiment_id = ?", [experiment]).fetchall()}
    for metric in (m for name, m, _, _ in groups.definitions() if name == dataset):
        reference = reference_metric(dataset, metric, samples, copy)
        n = len(samples["target"])
        assert reference(np.arange(n)) == pytest.approx(in_sql[metric], abs=1e-12)  # the full sample: SQL's value
        value, low, high = rows[metric]
        assert value == pytest.approx(in_sql[metric], abs=1e-12)
        expected = percentile_interval(brute_force(reference, n, DEFAULT_RESAMPLES, 0))
        assert (low, high) == pytest.approx(expected, abs=1e-12), metric
        assert low < high


def test_face_metric_rows_carry_the_brute_force_interval(evaluated):
    base, written = evaluated
    con = connect(str(base / "out"))
    experiment = con.execute("SELECT DISTINCT experiment_id FROM metrics WHERE dataset = 'fairness/fairface'"
                             ).fetchone()[0]
    predictions, positions = {}, None
    for head in ("race", "gender", "age", "toxic"):
        got = con.execute("SELECT sample_index, prediction FROM latest_samples WHERE experiment_id = ? AND unit = ? "
                          "ORDER BY sample_index", [experiment, f"face_{head}"]).fetchall()
        positions = np.array([i for i, _ in got])
        predictions[head] = np.array([p for _, p in got])
    codes = written["fairness/fairface"]
    metadata = SampleMetadata("fairness/fairface", "test", "hand", [f"f{i}" for i in range(len(codes))],
                              {f: codes[:, j] for j, f in enumerate(FIELDS)})
    brute = [reference.face_metrics("fairness/fairface", positions[row], {h: p[row] for h, p in predictions.items()}, metadata)
             for row in explicit_indices(len(positions), DEFAULT_RESAMPLES, 0)]
    rows = {m: (v, lo, hi) for m, v, lo, hi in con.execute(
        "SELECT metric, value, ci_low, ci_high FROM metrics WHERE experiment_id = ?", [experiment]).fetchall()}
    in_sql = dict(con.execute("SELECT metric, value FROM group_metrics WHERE experiment_id = ?",
                              [experiment]).fetchall())
    assert set(in_sql) <= set(rows)
    for metric, value in in_sql.items():
        assert rows[metric][0] == pytest.approx(value, abs=1e-9)
        expected = percentile_interval(np.array([b.get(metric, np.nan) for b in brute]))
        assert rows[metric][1:] == pytest.approx(expected, abs=1e-12), metric
    assert all(rows[f"{m}_wg"][1] is not None for m in ("acc_race", "acc_gender_x", "toxicity_crime"))


def test_a_suite_of_group_metrics_has_an_interval(evaluated):
    base, _ = evaluated
    con = connect(str(base / "out"))
    suite = Suite(name="groups", datasets=[SuiteEntry(dataset=d, main_metric=m, chance=0.01)
                                           for d, m in GROUP_SETS.items()])
    (score,) = score_suite(con, suite, resamples=300)
    assert score.complete and score.score is not None
    low, high = score.score_ci
    assert low is not None and high is not None and low < high
    assert score.normalized_ci[0] is not None
    for result in score.results:
        assert result.why_no_draws is None and result.draws is not None
        _, samples = image_rows(con, result.entry.dataset)
        copy = read_copy_by_hand(base / "data" / result.entry.dataset.replace("/", "-"))
        reference = reference_metric(result.entry.dataset, result.entry.main_metric, samples, copy)
        expected = brute_force(reference, len(samples["target"]), 300, _seed(result.entry.dataset, "image", 0))
        assert np.allclose(result.draws, expected, rtol=0, atol=1e-12), result.entry.dataset
    mean = np.mean([brute_force(reference_metric(r.entry.dataset, r.entry.main_metric, *image_rows(
        con, r.entry.dataset)[1:], read_copy_by_hand(base / "data" / r.entry.dataset.replace("/", "-"))),
        36, 300, _seed(r.entry.dataset, "image", 0)) for r in score.results], axis=0)
    assert (low, high) == pytest.approx(percentile_interval(mean), abs=1e-12)
    # in DataComp's own suite the group sets now have resamples (the suite stays partial: 33 sets are missing)
    (datacomp,) = score_suite(con, load_suite("datacomp"), resamples=50)
    mine = {r.entry.dataset: r for r in datacomp.results if r.entry.dataset in GROUP_SETS}
    assert all(r.draws is not None and r.why_no_draws is None for r in mine.values())
