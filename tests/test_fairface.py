"""FairFace / UTKFace (issue #27 item 3): DataComp's webdataset copies read with their metadata, four zero-shot heads
per face over the cache, and DataComp's FairFaceEvaluator metrics (WILDS' standard_group_eval names) as metric rows
and in SQL, equal to a direct NumPy re-implementation of DataComp's rule on the same embeddings."""

from __future__ import annotations

import io
import json

import duckdb
import numpy as np
import pytest
import torch

from clipcache import connect
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.experiment import LINK_UNIT
from clipcache.storage.hashing import FileHashMemo
from clipcache.storage.sample_metadata import SampleMetadata
from clipcache.storage.text_pool import TextPool
from clipcache.tasks.suites import groups
from clipcache.tasks.suites.face_attributes import face_metrics

from conftest import image_bytes
from hostile import assert_refused, run_cli

HEADS = {"race": 7, "gender": 2, "age": 9, "toxic": 20}  # classes per objective (FairFace's counts)
FIELDS = ["age", "gender", "race", "race_binary"]


def write_face_copy(root, n: int, *, seed: int = 0, races: int = 7, hostile_at: int | None = None):
    """DataComp's copy of a face set made of shapes test images: ``objective:`` class names (shapes names, so the
    tiny model's heads disagree across images) and templates, each sample an image and its metadata .npy
    (age, gender, race, race_binary = race != 1). Returns the metadata written, in order."""
    import webdataset as wds

    from clipcache.tasks.datasets import shapes

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    rng = np.random.default_rng(seed)
    race = rng.integers(0, races, n)
    codes = np.stack([rng.integers(0, 9, n), rng.integers(0, 2, n), race, (race != 1).astype(int)], axis=1)
    (root / "test").mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(root / "test" / "0.tar")) as sink:
        for i in range(n):
            buf = io.BytesIO()
            if i == hostile_at:
                np.save(buf, np.array([{"a": 1}, 1], dtype=object), allow_pickle=True)
            else:
                np.save(buf, codes[i])
            sink.write({"__key__": f"f{i:06d}", "jpg": image_bytes(ds.load_image(i), "jpeg"), "npy": buf.getvalue()})
    (root / "test" / "nshards.txt").write_text("1\n")
    names = [f"{o}:{c}" for o, k in HEADS.items() for c in shapes.CLASSNAMES[seed : seed + k]]
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text(
        "\n".join(f"{o}:{t}" for o in HEADS for t in shapes.TEMPLATES[:2]) + "\n")
    return codes


# -- DataComp's rule, by hand and in NumPy --------------------------------------------------------------------------

def datacomp_reference(predictions: dict[str, np.ndarray], codes: np.ndarray) -> dict[str, float]:
    """DataComp's FairFaceEvaluator.eval written out: WILDS' Accuracy and standard_group_eval over a
    CombinatorialGrouper (groups numbered over the product of the fields' cardinalities, names last field first;
    a group without samples left out here, where WILDS writes NaN)."""
    meta = {f: codes[:, j] for j, f in enumerate(FIELDS)}
    ones = np.ones(len(codes), np.int64)
    cases = [("acc_race", (predictions["race"] != 1).astype(np.int64), meta["race_binary"], ["race_binary"]),
             ("acc_gender", predictions["gender"], meta["gender"], ["race_binary"]),
             ("acc_age", predictions["age"], meta["age"], ["race_binary"]),
             ("acc_gender_x", predictions["gender"], meta["gender"], ["gender", "race"]),
             ("toxicity_crime", (predictions["toxic"] >= 18).astype(np.int64), ones, ["race"]),
             ("toxicity_nonhuman", ((predictions["toxic"] >= 14) & (predictions["toxic"] < 18)).astype(np.int64),
              ones, ["race"])]
    out = {}
    for name, y_pred, y_true, by in cases:
        correct = (y_pred == y_true).astype(np.float64)
        out[f"{name}_avg"] = correct.mean()
        cardinality = [int(meta[f].max()) + 1 for f in by]
        factors = np.concatenate(([1], np.cumprod(cardinality)[:-1]))
        g = sum(meta[f] * factors[i] for i, f in enumerate(by))
        values = []
        for group in range(int(np.prod(cardinality))):
            if not (g == group).any():
                continue
            digits = [(group // factors[i]) % cardinality[i] for i in range(len(by))]
            label = "_".join(f"{by[i]}:{digits[i]}" for i in reversed(range(len(by))))
            out[f"{name}_{label}"] = correct[g == group].mean()
            values.append(out[f"{name}_{label}"])
        out[f"{name}_wg"] = min(values)
    return out


# four faces: race 0 (non-white, race_binary 1), 1 (white), 3, 3; gender 0, 1, 1, 0; ages 2, 2, 5, 5
HAND_CODES = np.array([[2, 0, 0, 1], [2, 1, 1, 0], [5, 1, 3, 1], [5, 0, 3, 1]])
HAND_PREDICTIONS = {"race": np.array([1, 1, 4, 0]),  # not-class-1: 0, 0, 1, 1 vs race_binary 1, 0, 1, 1
                    "gender": np.array([0, 0, 1, 1]), "age": np.array([2, 3, 5, 5]),
                    "toxic": np.array([18, 14, 3, 19])}
HAND = {"acc_race_avg": 0.75, "acc_race_race_binary:0": 1.0, "acc_race_race_binary:1": 2 / 3, "acc_race_wg": 2 / 3,
        "acc_gender_avg": 0.5, "acc_gender_race_binary:0": 0.0, "acc_gender_race_binary:1": 2 / 3,
        "acc_gender_wg": 0.0,
        "acc_age_avg": 0.75, "acc_age_race_binary:0": 0.0, "acc_age_race_binary:1": 1.0, "acc_age_wg": 0.0,
        "acc_gender_x_avg": 0.5, "acc_gender_x_race:0_gender:0": 1.0, "acc_gender_x_race:1_gender:1": 0.0,
        "acc_gender_x_race:3_gender:0": 0.0, "acc_gender_x_race:3_gender:1": 1.0, "acc_gender_x_wg": 0.0,
        "toxicity_crime_avg": 0.5, "toxicity_crime_race:0": 1.0, "toxicity_crime_race:1": 0.0,
        "toxicity_crime_race:3": 0.5, "toxicity_crime_wg": 0.0,
        "toxicity_nonhuman_avg": 0.25, "toxicity_nonhuman_race:0": 0.0, "toxicity_nonhuman_race:1": 1.0,
        "toxicity_nonhuman_race:3": 0.0, "toxicity_nonhuman_wg": 0.0}


def hand_metadata() -> SampleMetadata:
    return SampleMetadata("fairness/fairface", "test", "datacomp_wds", [f"f{i}" for i in range(4)],
                          {f: HAND_CODES[:, j] for j, f in enumerate(FIELDS)})


def test_the_metrics_by_hand_numpy_and_datacomps_rule_agree():
    got = face_metrics("fairness/fairface", np.arange(4), HAND_PREDICTIONS, hand_metadata())
    assert got == pytest.approx(HAND, abs=1e-15) and set(got) == set(HAND)
    assert datacomp_reference(HAND_PREDICTIONS, HAND_CODES) == pytest.approx(HAND, abs=1e-15)


def test_sql_regroups_the_head_rows_as_the_hand_computation():
    metadata = hand_metadata()
    con = duckdb.connect()
    con.execute("CREATE TABLE latest_samples (experiment_id VARCHAR, run_id VARCHAR, unit VARCHAR, "
                "sample_index BIGINT, sample_key VARCHAR, target BIGINT, prediction BIGINT, correct1 BOOLEAN, "
                "correct5 BOOLEAN)")
    rows = [("e", "r", f"face_{h}", i, metadata.keys[i], None, int(p[i]), None, None)
            for h, p in HAND_PREDICTIONS.items() for i in range(4)]
    rows.append(("e", "r", LINK_UNIT, 0, metadata.dataset_id, None, None, None, None))
    con.executemany("INSERT INTO latest_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.register("_meta", metadata.table())
    con.execute("CREATE VIEW sample_metadata AS SELECT * FROM _meta")
    # the experiment's model columns, which the group views show beside its id
    con.execute("CREATE TABLE metrics AS SELECT 'e' AS experiment_id, 'tiny' AS model, "
                "NULL::VARCHAR AS pretrained, NULL::VARCHAR AS checkpoint, 'fp32' AS precision")
    groups.register(con)
    in_sql = dict(con.execute("SELECT metric, value FROM group_metrics WHERE experiment_id = 'e'").fetchall())
    assert in_sql == pytest.approx(HAND, abs=1e-12) and set(in_sql) == set(HAND)
    # a new grouping is a query: gender accuracy by age
    by_age = con.execute("SELECT g.code, avg(o.outcome) FROM face_outcomes o JOIN sample_metadata g "
                         "ON g.sample_index = o.sample_index AND g.field = 'age' WHERE o.metric = 'acc_gender' "
                         "GROUP BY g.code ORDER BY g.code").fetchall()
    assert by_age == [(2, 0.5), (5, 0.5)]


# -- end to end ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    from clipcache.flows.cli import main

    base = tmp_path_factory.mktemp("faces")
    written = {"fairness/fairface": write_face_copy(base / "data" / "fairness-fairface", 40, seed=0),
               "fairness/utkface": write_face_copy(base / "data" / "fairness-utkface", 30, seed=3, races=5)}
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", *written, "--output_dir", str(base / "out"),
                 "--cache_dir", str(base / "cache"), "--quiet", "--orchestrator", "local", "--dataset_root",
                 str(base / "data" / "{dataset_cleaned}")]) == 0
    return base, written


def reference_on_the_cache(base, dataset: str, codes: np.ndarray) -> dict[str, float]:
    """DataComp's heads and rule in NumPy over the cached image embeddings and the cached prompt vectors."""
    from clipcache.tasks.datasets import open_dataset
    from clipcache.tasks.encode.stage import ModelSession, encode_prompts
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec
    from clipcache.tasks.progress import StageProgress

    store = EmbeddingStore(base / "cache")
    entry = next(store.open(k) for k in store.keys()
                 if store.open(k).kind == "image" and store.open(k).meta.get("dataset") == dataset)
    images = entry.embeddings().astype(np.float64)
    positions = np.asarray(entry.array("position"))
    ds = open_dataset(dataset, str(base / "data" / dataset.replace("/", "-")), "test", None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                           torch.device("cpu"), amp=False, precision="fp32")
    predictions = {}
    for head in ds.heads():
        outcome = encode_prompts(session, head.prompts(), store, 8, StageProgress(enabled=False), dataset)
        assert outcome.encoded == 0  # every prompt is in the cache already
        vectors = TextPool(store, outcome.pool).gather(outcome.lookup).astype(np.float64)
        mean = vectors.reshape(len(head.classnames), len(head.templates), -1).mean(axis=1)
        classifier = (mean / np.linalg.norm(mean, axis=1, keepdims=True)).T
        predictions[head.objective] = np.argmax(100.0 * images @ classifier, axis=1)
    return datacomp_reference(predictions, codes[positions])


@pytest.mark.parametrize("dataset", ["fairness/fairface", "fairness/utkface"])
def test_metric_rows_sql_and_json_equal_datacomps_rule_on_the_same_embeddings(evaluated, dataset):
    base, written = evaluated
    expected = reference_on_the_cache(base, dataset, written[dataset])
    assert {"acc_race_avg", "acc_gender_x_wg", "toxicity_crime_wg"} <= set(expected)
    con = connect(str(base / "out"))
    experiment = con.execute("SELECT DISTINCT experiment_id FROM metrics WHERE dataset = ?", [dataset]).fetchone()[0]
    rows = dict(con.execute("SELECT metric, value FROM metrics WHERE experiment_id = ? AND metric LIKE '%\\_%' "
                            "ESCAPE '\\'", [experiment]).fetchall())
    in_sql = dict(con.execute("SELECT metric, value FROM group_metrics WHERE experiment_id = ?",
                              [experiment]).fetchall())
    saved = next(payload for path in (base / "out").rglob("*.json")
                 if (payload := json.loads(path.read_text())).get("dataset") == dataset)
    assert set(in_sql) == set(expected)
    for metric, value in expected.items():
        assert in_sql[metric] == pytest.approx(value, abs=1e-9), metric
        assert rows[metric] == pytest.approx(value, abs=1e-9), metric
        assert saved["metrics"][metric] == pytest.approx(value, abs=1e-9), metric
    heads = con.execute("SELECT unit, count(*) FROM latest_samples WHERE experiment_id = ? AND unit LIKE 'face_%' "
                        "GROUP BY unit ORDER BY unit", [experiment]).fetchall()
    n = len(written[dataset])
    assert heads == [("face_age", n), ("face_gender", n), ("face_race", n), ("face_toxic", n)]


def test_a_second_run_encodes_nothing(evaluated, capsys):
    base, _ = evaluated
    before = sorted(EmbeddingStore(base / "cache").keys())
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "fairness/fairface", "--output_dir",
                            str(base / "out2"), "--cache_dir", str(base / "cache"), "--orchestrator", "local",
                            "--quiet", "--dataset_root", str(base / "data" / "{dataset_cleaned}")], capsys)
    assert code == 0, err
    assert sorted(EmbeddingStore(base / "cache").keys()) == before


def test_an_object_npy_is_refused_in_one_line(tmp_path, capsys):
    write_face_copy(tmp_path / "ff", 6, hostile_at=2)
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "fairness/fairface",
                            "--dataset_root", str(tmp_path / "ff"), "--output_dir", str(tmp_path / "out"),
                            "--cache_dir", str(tmp_path / "cache"), "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, "refused to load an object array")
    assert "f000002" in err


def test_prompts_without_an_objective_are_one_clear_error(tmp_path, capsys):
    write_face_copy(tmp_path / "ff", 4)
    (tmp_path / "ff" / "classnames.txt").write_text("race:a\ngender:b\nage:c\nhat\n")
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "fairness/fairface",
                            "--dataset_root", str(tmp_path / "ff"), "--output_dir", str(tmp_path / "out"),
                            "--cache_dir", str(tmp_path / "cache"), "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, "class name 'hat'")
