"""Group metrics (issue #27 item 3): DataComp's WILDS and fairness sets read with their per-sample metadata, the
metadata stored once per dataset identity, and DataComp's group metrics computed in SQL over the sample rows, equal
to a direct NumPy / scikit-learn computation on the same samples and to the metric rows the evaluation writes."""

from __future__ import annotations

import io
import json
import pickle
import tarfile

import duckdb
import group_reference as reference
import numpy as np
import pytest
from sklearn.metrics import f1_score

from clipcache import connect
from clipcache.storage.errors import DatasetError
from clipcache.storage.experiment import LINK_UNIT
from clipcache.storage.sample_metadata import SampleMetadata
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.datacomp.group_layouts import group_layouts
from clipcache.tasks.suites import groups, load_suite
from clipcache.tasks.suites.scoring import score_suite

from conftest import REPO, image_bytes, perturbed_tiny_model
from hostile import assert_refused, canary_payload, run_cli

DATASETS = {"wilds/iwildcam": 30, "wilds/camelyon17": 2, "wilds/fmow": 30, "fairness/dollar_street": 30,
            "fairness/geode": 30}  # name -> classes of the synthetic copy


def synthetic_codes(name: str, n: int, seed: int) -> np.ndarray:
    """Each field's codes in {0, 1, 3}: code 2 is an empty group."""
    rng = np.random.default_rng(seed)
    fields = group_layouts()[name]["fields"]
    return rng.choice([0, 1, 3], size=(n, len(fields))).astype(np.int64)


def write_datacomp_copy(root, name: str, n: int, *, seed: int = 0, shards: int = 2, member=None):
    """DataComp's webdataset copy of ``name`` (classnames.txt, templates, test/N.tar with .webp, .cls, .npy) made of
    shapes test images; a third of the labels are shuffled so that groups differ. ``member(i, sample)`` may change
    a sample's members. Returns (labels, metadata codes) as written."""
    import webdataset as wds

    from clipcache.tasks.datasets import shapes

    n_classes = DATASETS[name]
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    rng = np.random.default_rng(seed + 1)
    labels = np.array([int(ds.labels[i]) % n_classes for i in range(n)])
    shuffled = rng.random(n) < 0.33
    labels[shuffled] = rng.integers(0, n_classes, shuffled.sum())
    codes = synthetic_codes(name, n, seed)
    (root / "test").mkdir(parents=True, exist_ok=True)
    per_shard = -(-n // shards)
    for s in range(shards):
        with wds.TarWriter(str(root / "test" / f"{s}.tar")) as sink:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                buf = io.BytesIO()
                np.save(buf, codes[i])
                sample = {"__key__": f"s{i:06d}", "webp": image_bytes(ds.load_image(i), "webp"),
                          "cls": str(int(labels[i])), "npy": buf.getvalue()}
                if member is not None:
                    member(i, sample)
                sink.write(sample)
    (root / "test" / "nshards.txt").write_text(f"{shards}\n")
    (root / "classnames.txt").write_text("\n".join(shapes.CLASSNAMES[:n_classes]) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(shapes.TEMPLATES) + "\n")
    return labels, codes


def read_copy_by_hand(root) -> dict[str, tuple[int, np.ndarray]]:
    """sample key -> (label, metadata vector), read from the tar files with tarfile and np.load (the reference)."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted((root / "test").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                out.setdefault(f"{shard.name}/{key}", {})[ext] = tar.extractfile(m).read()
    return {k: (int(v["cls"]), np.load(io.BytesIO(v["npy"]))) for k, v in out.items()}


# -- the definitions, by hand ---------------------------------------------------------------------------------------

TARGET = np.array([0, 0, 1, 1, 2, 2])
PREDICTION = np.array([0, 1, 1, 1, 2, 3])  # 3: a class absent from the targets (a miss, never a false positive)
CORRECT5 = np.array([1, 1, 1, 1, 1, 0], bool)
REGION = np.array([0, 0, 1, 1, 3, 3])  # group 2 has no sample; groups 0 and 3 tie for the worst top-1 accuracy


def test_macro_f1_and_worst_group_by_hand():
    # class 0: tp 1, predicted 1, support 2 -> 2/3; class 1: 4/5; class 2: 2/3 (class 3 is not a label)
    assert reference.macro_f1(TARGET, PREDICTION) == pytest.approx(32 / 45, abs=1e-15)
    assert reference.macro_f1(TARGET, PREDICTION) == pytest.approx(
        f1_score(TARGET, PREDICTION, average="macro", labels=np.unique(TARGET)), abs=1e-15)
    correct1 = PREDICTION == TARGET
    assert reference.group_accuracy(correct1, REGION) == {0: (2, 0.5), 1: (2, 1.0), 3: (2, 0.5)}
    assert reference.worst_group(correct1, REGION) == 0.5 and reference.worst_group(CORRECT5, REGION) == 0.5


def hand_warehouse(metadata: SampleMetadata) -> duckdb.DuckDBPyConnection:
    """The tables the group views read, made by hand: one experiment's image rows and its metadata link."""
    con = duckdb.connect()
    con.execute("CREATE TABLE latest_samples (experiment_id VARCHAR, run_id VARCHAR, unit VARCHAR, "
                "sample_index BIGINT, sample_key VARCHAR, target BIGINT, prediction BIGINT, correct1 BOOLEAN, "
                "correct5 BOOLEAN)")
    rows = [("e", "r", "image", i, metadata.keys[i], int(TARGET[i]), int(PREDICTION[i]),
             bool(PREDICTION[i] == TARGET[i]), bool(CORRECT5[i])) for i in range(len(TARGET))]
    rows.append(("e", "r", LINK_UNIT, 0, metadata.dataset_id, None, None, None, None))
    con.executemany("INSERT INTO latest_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    table = metadata.table()
    con.register("_meta", table)
    con.execute("CREATE VIEW sample_metadata AS SELECT * FROM _meta")
    # the experiment's model columns, which the group views show beside its id
    con.execute("CREATE TABLE metrics AS SELECT 'e' AS experiment_id, 'tiny' AS model, "
                "NULL::VARCHAR AS pretrained, NULL::VARCHAR AS checkpoint, 'fp32' AS precision")
    groups.register(con)
    return con


@pytest.mark.parametrize("name, metric, expected", [("fairness/geode", "acc_wg", 0.5),
                                                    ("fairness/dollar_street", "acc_top5_wg", 0.5),
                                                    ("wilds/iwildcam", "F1-macro_all", 32 / 45)])
def test_sql_group_metrics_equal_the_hand_computation(name, metric, expected):
    fields = group_layouts()[name]["fields"]
    codes = {f: REGION.copy() for f in fields}
    metadata = SampleMetadata(name, "test", "hand", [f"k{i}" for i in range(6)], codes,
                              {fields[0]: {0: "A", 1: "B", 2: "C", 3: "D"}})
    con = hand_warehouse(metadata)
    found = con.execute("SELECT metric, value, groups, model FROM group_metrics").fetchall()
    assert [(m, pytest.approx(v, abs=1e-15), model) for m, v, _, model in found] == [(metric, expected, "tiny")]
    per_group = con.execute("SELECT code, label, n, acc1, acc5 FROM group_accuracy WHERE field = ? ORDER BY code",
                            [fields[0]]).fetchall()
    assert per_group == [(0, "A", 2, 0.5, 1.0), (1, "B", 2, 1.0, 1.0), (3, "D", 2, 0.5, 0.5)]  # no row for C
    samples = {"sample_index": np.arange(6), "target": TARGET, "prediction": PREDICTION,
               "correct1": PREDICTION == TARGET, "correct5": CORRECT5}
    assert groups.group_metrics(name, samples, metadata) == {metric: pytest.approx(expected, abs=1e-15)}


# -- reading the layouts --------------------------------------------------------------------------------------------

def test_datacomp_copy_is_read_with_its_metadata_and_limit_takes_the_first_samples(tmp_path):
    labels, codes = write_datacomp_copy(tmp_path / "geode", "fairness/geode", 10, shards=3)
    ds = open_dataset("fairness/geode", str(tmp_path / "geode"), "test", None)
    assert np.array_equal(ds.labels, labels) and np.array_equal(ds.codes, codes)
    meta = ds.sample_metadata()
    assert meta.keys[0] == "0.tar/s000000" and np.array_equal(meta.codes["region"], codes[:, 0])
    limited = open_dataset("fairness/geode", str(tmp_path / "geode"), "test", 4)
    assert np.array_equal(limited.codes, codes[:4]) and limited.sample_metadata().dataset_id != meta.dataset_id
    assert open_dataset("fairness/geode", str(tmp_path / "geode"), "test", None).sample_metadata().dataset_id == \
        meta.dataset_id  # the same data: the same identity, so one metadata file serves every model


def test_wilds_folder_is_read_from_its_metadata_csv(tmp_path):
    from clipcache.tasks.datasets import shapes

    root = tmp_path / "wilds"
    folder = root / "iwildcam_v2.0"
    (folder / "train").mkdir(parents=True)
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 5)
    lines = ["split,location_remapped,sequence_remapped,datetime,y,filename"]
    for i in range(5):
        ds.load_image(i).save(folder / "train" / f"img{i}.jpg")
        split = "train" if i == 2 else "test"
        lines.append(f"{split},{i % 2},{i},2013-0{i + 1}-0{i + 2} 1{i}:0{i}:3{i}.000,{i},img{i}.jpg")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    (root / "classnames.txt").write_text("\n".join(shapes.CLASSNAMES[:5]) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n")
    data = open_dataset("wilds/iwildcam", str(root), "test", None)
    assert list(data.labels) == [0, 1, 3, 4] and data.sample_key(0) == "train/img0.jpg"
    meta = data.sample_metadata()
    assert list(meta.codes["location"]) == [0, 1, 1, 0] and list(meta.codes["month"]) == [1, 2, 4, 5]
    assert list(meta.codes["second"]) == [30, 31, 33, 34] and list(meta.codes["year"]) == [2013] * 4
    (root / "zeroshot_classification_templates.txt").unlink()
    with pytest.raises(DatasetError, match="zeroshot_classification_templates.txt is missing"):
        open_dataset("wilds/iwildcam", str(root), "test", None)


def test_without_its_files_the_error_names_both_layouts(tmp_path):
    with pytest.raises(DatasetError, match="wds_wilds-iwildcam_test.*iwildcam_v2.0/metadata.csv"):
        open_dataset("wilds/iwildcam", str(tmp_path), "test", None)
    with pytest.raises(DatasetError, match="needs --dataset_root"):
        open_dataset("fairness/geode", None, "test", None)


def test_metadata_that_is_not_whole_numbers_is_refused(tmp_path):
    def bad(i, sample):
        buf = io.BytesIO()
        np.save(buf, np.array([0.5, 1.0]))
        sample["npy"] = buf.getvalue()

    write_datacomp_copy(tmp_path / "geode", "fairness/geode", 4, member=bad)
    with pytest.raises(DatasetError, match="whole numbers"):
        open_dataset("fairness/geode", str(tmp_path / "geode"), "test", None)


class _Payload:
    def __init__(self, source: str):
        self.source = source

    def __reduce__(self):
        return exec, (self.source,)


@pytest.mark.parametrize("kind", ["pyd", "object_npy"])
def test_a_metadata_member_that_would_run_code_is_one_clear_error_and_nothing_runs(tmp_path, capsys, kind):
    canary = tmp_path / "canary"

    def hostile(i, sample):
        if i != 3:
            return
        del sample["npy"]
        if kind == "pyd":
            sample["pyd"] = pickle.dumps(_Payload(canary_payload(canary)))
        else:
            buf = io.BytesIO()
            np.save(buf, np.array([_Payload(canary_payload(canary)), 1], dtype=object), allow_pickle=True)
            sample["npy"] = buf.getvalue()

    write_datacomp_copy(tmp_path / "geode", "fairness/geode", 6, member=hostile)
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "fairness/geode", "--dataset_root",
                            str(tmp_path / "geode"), "--output_dir", str(tmp_path / "out"), "--cache_dir",
                            str(tmp_path / "cache"), "--quiet", "--orchestrator", "local"], capsys)
    phrase = "refused to load 'builtins.exec'" if kind == "pyd" else "refused to load an object array"
    assert_refused(code, err, phrase)
    assert "s000003" in err and not canary.exists()
    assert not (tmp_path / "out" / "warehouse" / "sample_metadata").exists()


# -- end to end: `clipcache eval`, the metric rows, the SQL views and the suite ------------------------------------

@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The five DataComp sets (synthetic copies) evaluated with the bundled model; GeoDE also with a perturbed
    copy of it (a second model joins the same metadata)."""
    from clipcache.flows.cli import main

    base = tmp_path_factory.mktemp("groups")
    written = {name: write_datacomp_copy(base / "data" / name.replace("/", "-"), name, 36, seed=i)
               for i, name in enumerate(DATASETS)}
    dirs = ["--output_dir", str(base / "out"), "--cache_dir", str(base / "cache"), "--quiet", "--orchestrator",
            "local", "--dataset_root", str(base / "data" / "{dataset_cleaned}")]
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", *DATASETS, *dirs]) == 0
    perturbed = perturbed_tiny_model(base / "perturbed")
    assert main(["eval", "--model", f"local-dir:{perturbed}", "--dataset", "fairness/geode", *dirs]) == 0
    return base, written


def latest(con, dataset: str, model: str = "tiny-shapes-clip") -> tuple[str, dict[str, np.ndarray]]:
    experiment = con.execute("SELECT DISTINCT experiment_id FROM leaderboard WHERE dataset = ? AND model = ?",
                             [dataset, model]).fetchone()[0]
    rows = con.execute("SELECT sample_key, target, prediction, correct1, correct5 FROM latest_samples "
                       "WHERE experiment_id = ? AND unit = 'image' ORDER BY sample_index", [experiment]).fetchall()
    columns = dict(zip(("sample_key", "target", "prediction", "correct1", "correct5"), zip(*rows, strict=True),
                       strict=True))
    return experiment, {k: np.array(v) for k, v in columns.items()}


def by_hand(dataset: str, samples: dict[str, np.ndarray], copy: dict) -> dict[str, float]:
    """DataComp's metrics from the sample rows and the metadata read from the tar files, with NumPy / sklearn."""
    fields = group_layouts()[dataset]["fields"]
    out = {}
    for spec in group_layouts()[dataset]["metrics"]:
        if spec["statistic"] == "macro_f1":
            target = samples["target"].astype(int)
            out[spec["metric"]] = f1_score(target, samples["prediction"].astype(int), average="macro",
                                           labels=np.unique(target))
            continue
        column = samples["correct1" if spec["statistic"] == "worst_acc1" else "correct5"]
        if column[0] is None:
            continue
        codes = np.array([copy[k][1][fields.index(spec["field"])] for k in samples["sample_key"]])
        out[spec["metric"]] = min(column[codes == g].astype(float).mean() for g in np.unique(codes))
    return out


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_group_metrics_equal_numpy_the_metric_rows_and_the_json(evaluated, dataset):
    base, _ = evaluated
    con = connect(str(base / "out"))
    experiment, samples = latest(con, dataset)
    copy = read_copy_by_hand(base / "data" / dataset.replace("/", "-"))
    assert [copy[k][0] for k in samples["sample_key"]] == list(samples["target"])  # the rows are the tar's samples
    expected = by_hand(dataset, samples, copy)
    assert expected  # every dataset has at least one group metric
    in_sql = dict(con.execute("SELECT metric, value FROM group_metrics WHERE experiment_id = ?",
                              [experiment]).fetchall())
    rows = dict(con.execute("SELECT metric, value FROM leaderboard WHERE experiment_id = ? AND metric IN "
                            "(SELECT metric FROM group_definitions)", [experiment]).fetchall())
    saved = next(payload for path in (base / "out").rglob("*.json")
                 if (payload := json.loads(path.read_text())).get("dataset") == dataset
                 and payload.get("model") == "tiny-shapes-clip")
    for metric, value in expected.items():
        assert in_sql[metric] == pytest.approx(value, abs=1e-12), metric
        assert rows[metric] == pytest.approx(in_sql[metric], abs=1e-12), metric
        assert saved["metrics"][metric] == pytest.approx(value, abs=1e-12)
    # per-group accuracy of every field, against NumPy
    fields = group_layouts()[dataset]["fields"]
    for field in fields:
        codes = np.array([copy[k][1][fields.index(field)] for k in samples["sample_key"]])
        got = con.execute("SELECT code, n, acc1 FROM group_accuracy WHERE experiment_id = ? AND field = ? "
                          "ORDER BY code", [experiment, field]).fetchall()
        assert got == [(g, int((codes == g).sum()), samples["correct1"][codes == g].astype(float).mean())
                       for g in np.unique(codes)]


def test_metadata_is_written_once_and_a_second_model_joins_it(evaluated):
    base, _ = evaluated
    con = connect(str(base / "out"))
    files = sorted((base / "out" / "warehouse" / "sample_metadata").glob("*.parquet"))
    assert len(files) == len(DATASETS)
    joined = con.execute("SELECT dataset_id, count(DISTINCT experiment_id) FROM experiment_metadata "
                         "WHERE dataset = 'fairness/geode' GROUP BY dataset_id").fetchall()
    assert len(joined) == 1 and joined[0][1] == 2
    assert con.execute("SELECT count(*) FROM sample_metadata WHERE dataset = 'fairness/geode'").fetchone()[0] == 36 * 2


def test_a_new_grouping_is_a_query(evaluated):
    """Worst-country accuracy on GeoDE (not a DataComp metric): one query over the views, equal to NumPy."""
    base, written = evaluated
    con = connect(str(base / "out"))
    experiment, samples = latest(con, "fairness/geode")
    worst = con.execute("SELECT min(acc1) FROM group_accuracy WHERE experiment_id = ? AND field = 'country'",
                        [experiment]).fetchone()[0]
    copy = read_copy_by_hand(base / "data" / "fairness-geode")
    country = np.array([copy[k][1][1] for k in samples["sample_key"]])
    assert worst == min(samples["correct1"][country == g].astype(float).mean() for g in np.unique(country))
    # two fields at once: region x country, by joining the metadata rows to each other
    cells = con.execute("""
        SELECT r.code AS region, c.code AS country, avg(CAST(r.correct1 AS DOUBLE)) AS acc1
        FROM sample_groups r JOIN sample_groups c USING (experiment_id, sample_index)
        WHERE r.experiment_id = ? AND r.field = 'region' AND c.field = 'country'
        GROUP BY ALL ORDER BY ALL""", [experiment]).fetchall()
    region = np.array([copy[k][1][0] for k in samples["sample_key"]])
    assert [(a, b) for a, b, _ in cells] == sorted({(int(a), int(b)) for a, b in zip(region, country, strict=True)})
    # the example of docs/suites.md, as written there
    section = (REPO / "docs" / "suites.md").read_text().split("## Group metrics", 1)[1]
    example = section.split("```sql\n", 1)[1].split("```", 1)[0]
    mine = [(c, n, acc) for model, c, n, acc in con.execute(example).fetchall() if model == "tiny-shapes-clip"]
    assert sorted(mine) == [(g, int((country == g).sum()), samples["correct1"][country == g].astype(float).mean())
                            for g in np.unique(country)]


def test_datacomp_suite_picks_up_the_main_metrics(evaluated, capsys):
    base, _ = evaluated
    con = connect(str(base / "out"))
    suite = load_suite("datacomp")
    assert all(e.runnable for e in suite.datasets if e.dataset in DATASETS)
    scores = {s.model[0]: s for s in score_suite(con, suite, resamples=0)}
    results = {r.entry.dataset: r for r in scores["tiny-shapes-clip"].results}
    for dataset in DATASETS:
        entry = results[dataset].entry
        value = con.execute("SELECT value FROM leaderboard WHERE dataset = ? AND model = 'tiny-shapes-clip' AND "
                            "metric = ? AND k IS NOT DISTINCT FROM ?", [dataset, *entry.metric_parts()[0]]).fetchone()
        assert results[dataset].value == pytest.approx(value[0], abs=1e-12), dataset
    code, out, _ = run_cli(["suite", "score", "datacomp", "--output_dir", str(base / "out"), "--format", "json",
                            "--bootstrap", "0"], capsys)
    assert code == 0
    mine = next(p for p in json.loads(out) if p["model"] == "tiny-shapes-clip")
    assert not set(mine["missing"]) & set(DATASETS) and mine["score"] is None  # partial: the other 33 are missing
