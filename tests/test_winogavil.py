"""WinoGAViL (DataComp's misc/winogavil): DataComp's Jaccard rule on hand-computed games (ties, k = the number of
associations, k = 0, an association that is no candidate) against a direct re-implementation of
eval_utils/wino_eval.py; a tiny copy of DataComp's Hugging Face cache written with ``datasets``' own ArrowWriter
(embedded images, and images by path in a moved cache); `clipcache eval --dataset misc/winogavil` end to end with
the bundled tiny model against DataComp's loop run on the same files; the suite's interval from the game rows; bad
input in one line."""

from __future__ import annotations

import glob
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import check_name, default_task, shapes
from clipcache.tasks.datasets.datacomp.winogavil import clip_prompt, open_winogavil
from clipcache.tasks.score.intervals import paired_draws
from clipcache.tasks.score.winogavil import game_outcomes, jaccard_statistic, winogavil_metrics
from clipcache.tasks.suites import load_suite
from clipcache.tasks.suites.exports import datacomp_jsonl
from clipcache.tasks.suites.scoring import score_suite

from hostile import assert_refused, run_cli

CACHE = Path("hf_cache/nlphuji___winogavil/default/0.0.0/0123abcd")
GROUPS = ("avg_jaccard_score", "jaccard_score_5", "jaccard_score_6", "jaccard_score_10", "jaccard_score_12",
          "jaccard_score_5-6", "jaccard_score_10-12")


# -- DataComp's rule, re-implemented from eval_utils/wino_eval.py -----------------------------------------------------
def datacomp_prompt(item: str) -> str:
    item = item.lower()
    return f"An {item}" if item[0] in ["a", "e", "i", "o", "u"] else f"A {item}"


def datacomp_game(image_logits: np.ndarray, y_true: np.ndarray) -> float:
    from sklearn.metrics import jaccard_score

    n_assoc = y_true.sum()
    topk_indices = np.argsort(image_logits)[-n_assoc:]
    y_pred = np.isin(np.arange(len(image_logits)), topk_indices)
    return float(jaccard_score(y_true, y_pred))


def datacomp_metrics(scores: list[float], groups: list[int]) -> dict[str, float]:
    all_scores, all_groups = np.array(scores), np.array(groups)
    with warnings.catch_warnings():  # numpy's mean of an empty group: NaN and a warning, as in DataComp
        warnings.simplefilter("ignore", RuntimeWarning)
        return {"avg_jaccard_score": all_scores.mean(),
                "jaccard_score_5": all_scores[all_groups == 5].mean(),
                "jaccard_score_6": all_scores[all_groups == 6].mean(),
                "jaccard_score_10": all_scores[all_groups == 10].mean(),
                "jaccard_score_12": all_scores[all_groups == 12].mean(),
                "jaccard_score_5-6": all_scores[all_groups <= 6].mean(),
                "jaccard_score_10-12": all_scores[all_groups >= 10].mean()}


def same(a: dict[str, float | None], b: dict[str, float]) -> bool:
    """Equal metrics; NaN (DataComp) and null (a JSON file) both mean an empty group."""
    def empty(v: float | None) -> bool:
        return v is None or math.isnan(v)

    return a.keys() == b.keys() and all(empty(a[k]) == empty(b[k]) and (empty(a[k]) or a[k] == pytest.approx(
        b[k], abs=1e-12)) for k in a)


# -- hand-computed games ----------------------------------------------------------------------------------------------
def on_a_circle(scores: list[float]) -> np.ndarray:
    """Unit vectors whose dot product with (1, 0) is exactly each score."""
    s = np.asarray(scores, np.float64)
    return np.stack([s, np.sqrt(1 - s**2)], axis=1)


HAND = [  # (scores, truth, expected Jaccard index (None: a boundary tie, numpy's choice), boundary tie)
    ([0.9, 0.1, 0.5, 0.3, 0.2], [1, 0, 1, 0, 0], 1.0, False),  # k = 2, both found
    ([0.9, 0.8, 0.1, 0.2, 0.3, 0.4], [1, 0, 0, 0, 0, 1], 1 / 3, False),  # one of two found: 1 / |{0, 1, 5}|
    ([0.7, 0.7, 0.1, 0.2, 0.3], [1, 0, 0, 1, 0], 1 / 3, False),  # a tie inside the top k decides nothing
    ([0.5, 0.5, 0.9, *[0.01 * i for i in range(1, 8)]], [0, 1, 1, *[0] * 7], None, True),  # k-th = (k+1)-th
    ([0.3, 0.2, 0.1, 0.4, 0.6], [0, 0, 0, 0, 0], 0.0, False),  # k = 0: DataComp's [-0:] takes all, Jaccard 0
    ([0.05 * i for i in range(12)], [0] * 8 + [1, 0, 1, 1], 0.5, False),  # k = 3 of 12: {9, 10, 11} vs {8, 10, 11}
]


def test_hand_computed_games_equal_datacomps_rule():
    cue = np.array([[1.0, 0.0]])
    candidates = [on_a_circle(s) for s, *_ in HAND]
    truth = [np.asarray(t, bool) for _, t, *_ in HAND]
    out = game_outcomes(np.repeat(cue, len(HAND), axis=0), candidates, truth)
    for g, (scores, t, expected, tied) in enumerate(HAND):
        reference = datacomp_game(candidates[g] @ cue[0], np.asarray(t, bool))
        assert out["value"][g] == reference, g
        if expected is None:
            assert reference in (1.0, 1 / 3)  # which of the tied 0.5s numpy keeps
        else:
            assert reference == pytest.approx(expected, abs=1e-15), g
        assert out["tied"][g] == tied and out["target"][g] == len(scores)
    assert list(out["prediction"][[0, 1, 2, 4, 5]]) == [2, 1, 1, 0, 2]
    assert out["margin"][0] == pytest.approx(0.5 - 0.3) and out["score"][0] == pytest.approx(0.5)
    assert np.isnan(out["margin"][4]) and np.isnan(out["score"][4])  # k = 0
    top = out["top"]
    assert list(top.values[top.offsets[0]:top.offsets[1]]) == [0, 2]  # the chosen, best first
    assert list(top.values[top.offsets[4]:top.offsets[5]]) == [4, 3, 0, 1, 2]  # k = 0: every candidate
    groups = [len(s) for s, *_ in HAND]
    metrics = winogavil_metrics(out["value"], out["target"])
    assert same(metrics, datacomp_metrics(list(out["value"]), groups))
    assert metrics["jaccard_score_5"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert metrics["jaccard_score_12"] == 0.5 and metrics["jaccard_score_6"] == pytest.approx(1 / 3)
    assert metrics["jaccard_score_10-12"] == pytest.approx((out["value"][3] + 0.5) / 2)
    # a group without games is NaN, as numpy's mean of nothing in DataComp
    five = winogavil_metrics(out["value"][[0, 2]], out["target"][[0, 2]])
    assert same(five, datacomp_metrics(list(out["value"][[0, 2]]), [5, 5])) and math.isnan(five["jaccard_score_12"])


def test_group_statistic_resamples_all_games():
    rng = np.random.default_rng(1)
    values, groups = rng.random(40), rng.choice([5, 6, 10, 12], 40)
    for metric in GROUPS:
        identity = np.arange(40)[None, :]
        assert jaccard_statistic(values, groups, metric)(identity)[0] == pytest.approx(
            winogavil_metrics(values, groups)[metric])
    draws = paired_draws(jaccard_statistic(values, groups, "jaccard_score_10-12"), 40, resamples=50, seed=0)
    idx = np.random.default_rng(0).integers(0, 40, size=(50, 40), dtype=np.int32)
    brute = [values[i][groups[i] >= 10].mean() for i in idx]
    assert np.allclose(draws, brute)


def test_clip_prompt_is_datacomps():
    for cue in ("Orange", "apple", "Umbrella", "bison", "X-ray", "élan"):
        assert clip_prompt(cue) == datacomp_prompt(cue)


# -- a tiny copy of DataComp's Hugging Face cache ---------------------------------------------------------------------
def features(without: str | None = None):
    import datasets

    fields = {"candidates": [datasets.Value("string")], "cue": datasets.Value("string"),
              "associations": [datasets.Value("string")], "score_fool_the_ai": datasets.Value("float64"),
              "num_associations": datasets.Value("int64"), "num_candidates": datasets.Value("int64"),
              "solvers_jaccard_mean": datasets.Value("float64"), "solvers_jaccard_std": datasets.Value("float64"),
              "ID": datasets.Value("int64"), "candidate_images": [datasets.Image()]}
    return datasets.Features({k: v for k, v in fields.items() if k != without})


def games() -> list[dict]:
    """Shapes games: the cue is a class name, its associations the candidates showing that class (an image may sit
    in several games); one association names no candidate (DataComp's np.isin ignores it)."""
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 80)
    labels = [int(x) for x in ds.labels]
    rng = np.random.default_rng(0)
    out = []
    plan = [(5, 0), (6, 27), (10, 12), (12, 25), (5, 7), (10, 3), (12, 18), (6, 20), (10, 26), (12, 9)]
    for g, (n, cls) in enumerate(plan):
        right = [i for i, label in enumerate(labels) if label == cls][:2]
        others = [int(i) for i in rng.choice([i for i, label in enumerate(labels) if label != cls], n - len(right),
                                             replace=False)]
        chosen = right + others
        rng.shuffle(chosen)
        cue = shapes.CLASSNAMES[cls]
        out.append({"ID": 100 + g, "cue": cue.title() if g == 3 else cue, "candidates": [f"img{i}" for i in chosen],
                    "associations": [f"img{i}" for i in right] + (["img999"] if g == 1 else []),
                    "score_fool_the_ai": 50.0, "num_associations": len(right), "num_candidates": n,
                    "solvers_jaccard_mean": 1.0, "solvers_jaccard_std": 0.0, "_images": chosen})
    return out


def write_cache(root: Path, records: list[dict], *, by_path: bool = False, without: str | None = None) -> Path:
    """DataComp's data root: hf_cache/nlphuji___winogavil/.../winogavil-test.arrow, written by datasets' ArrowWriter
    as its builder writes the cache (images embedded, or by path into the cache's downloads folder)."""
    from datasets.arrow_writer import ArrowWriter

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 80)
    folder = root / CACHE
    folder.mkdir(parents=True, exist_ok=True)
    images = root / "hf_cache/downloads/extracted/5f1e/winogavil_images"
    writer = ArrowWriter(features=features(without), path=str(folder / "winogavil-test.arrow"))
    for record in records:
        example = {k: v for k, v in record.items() if not k.startswith("_") and k != without}
        if without != "candidate_images":
            cells = []
            for i in record["_images"]:
                if by_path:
                    images.mkdir(parents=True, exist_ok=True)
                    path = images / f"img{i}.png"
                    ds.load_image(i).save(path)
                    cells.append(str(path.resolve()))
                else:
                    cells.append(ds.load_image(i))
            example["candidate_images"] = cells
        writer.write(example)
    writer.finalize()
    writer.close()
    return root


def test_reader_indexes_games_and_distinct_images(tmp_path):
    records = games()
    root = write_cache(tmp_path / "data", records)
    data = open_winogavil("misc/winogavil", root, "test", None)
    distinct = {i for r in records for i in r["_images"]}
    assert len(data.images) == len(distinct) < sum(len(r["_images"]) for r in records)  # each image once
    assert data.cues == [datacomp_prompt(r["cue"]) for r in records] and data.cues[3] == "An orange circle"
    assert data.keys == [str(r["ID"]) for r in records]
    source = shapes.load_shapes("fixture", "zeroshot_classification", "test", 80)
    assert [data.images.load_image(int(row)).tobytes() for row in data.game_images[0]] == [
        source.load_image(i).convert("RGB").tobytes() for i in records[0]["_images"]]
    for g, r in enumerate(records):
        assert list(data.truth[g]) == list(np.isin(r["candidates"], r["associations"]))
    assert data.truth[1].sum() == 2  # "img999" is no candidate
    # every root DataComp's cache can be named by leads to the same file
    for where in (root / "hf_cache", root / "hf_cache/nlphuji___winogavil", root / CACHE):
        assert open_winogavil("misc/winogavil", where, "test", 3).files == data.files
    assert len(open_winogavil("misc/winogavil", root, "test", 3).truth) == 3
    check_name("misc/winogavil")
    assert default_task("misc/winogavil", str(root)) == "winogavil"


def test_images_by_path_in_a_moved_cache(tmp_path):
    records = games()[:3]
    write_cache(tmp_path / "there", records, by_path=True)
    shutil.move(tmp_path / "there", tmp_path / "here")  # the stored absolute paths now point nowhere
    data = open_winogavil("misc/winogavil", tmp_path / "here", "test", None)
    assert all(isinstance(s, Path) and (tmp_path / "here") in s.parents for s in data.images.sources)
    assert data.images.load_image(0).mode == "RGB"
    next(iter((tmp_path / "here").rglob("img*.png"))).unlink()
    with pytest.raises(DatasetError, match=r"winogavil-test.arrow row \d+ candidate \d+ \('img\d+'\): image file "):
        open_winogavil("misc/winogavil", tmp_path / "here", "test", None)



def test_an_image_path_outside_the_cache_is_never_opened(tmp_path):
    """An Arrow file is data: a path in it naming a file outside its own cache (another folder, /etc/...) is refused,
    even where that file exists."""
    records = games()[:2]
    write_cache(tmp_path / "a", records, by_path=True)  # its paths name a/hf_cache/downloads/...
    arrow = next((tmp_path / "a").rglob("winogavil-test.arrow"))
    elsewhere = tmp_path / "b" / arrow.relative_to(tmp_path / "a")
    elsewhere.parent.mkdir(parents=True)
    shutil.copy(arrow, elsewhere)  # b's cache, pointing into a's
    with pytest.raises(DatasetError, match="image file .* not found"):
        open_winogavil("misc/winogavil", tmp_path / "b", "test", None)

# -- end to end -------------------------------------------------------------------------------------------------------
def cli(command, root, tmp_path, *extra):
    return main([command, "--model", "tiny-shapes-clip", "--dataset", "misc/winogavil", "--dataset_root", str(root),
                 "--orchestrator", "local", "--quiet", "--output_dir", str(tmp_path / "out"), "--cache_dir",
                 str(tmp_path / "cache"), *extra])


def datacomp_loop(arrow: Path) -> tuple[list[float], list[int]]:
    """DataComp's evaluate_winogavil_dataset on the cache file (datasets' own reader and image decoding), with the
    tiny model's transform and encoders in place of open_clip's (fp32 on the CPU)."""
    import datasets

    from clipcache.tasks.encode.stage import ModelSession
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                           torch.device("cpu"), amp=False, precision="fp32")
    model = session.model
    scores, groups = [], []
    for example in datasets.Dataset.from_file(str(arrow)):
        images = torch.stack([model.image_transform(img.convert("RGB")) for img in example["candidate_images"]])
        y_true = np.isin(example["candidates"], example["associations"])
        image_features = model.encode_images(images)
        text_features = model.encode_texts([datacomp_prompt(example["cue"])])
        scores.append(datacomp_game((text_features @ image_features.T).squeeze(0), y_true))
        groups.append(len(example["candidate_images"]))
    return scores, groups


def test_cli_eval_equals_datacomps_loop_and_the_suite_has_an_interval(tmp_path, capsys):
    records = games()
    root = write_cache(tmp_path / "data", records)
    assert cli("eval", root, tmp_path) == 0
    [file] = glob.glob(str(tmp_path / "out" / "tiny-shapes-clip" / "*winogavil*.json"))
    saved = json.loads(Path(file).read_text())
    assert saved["task"] == "winogavil" and set(saved["metrics"]) == set(GROUPS)
    expected_scores, expected_groups = datacomp_loop(root / CACHE / "winogavil-test.arrow")
    assert same(saved["metrics"], datacomp_metrics(expected_scores, expected_groups))
    assert saved["metrics"]["avg_jaccard_score"] > 0.5  # a trained model: far above the 0.2-0.4 of chance
    con = connect(str(tmp_path / "out"))
    s = con.sql("SELECT * FROM latest_samples WHERE task = 'winogavil' AND unit = 'game' ORDER BY sample_index"
                ).to_arrow_table().to_pydict()
    assert s["value"] == pytest.approx(expected_scores, abs=1e-12) and s["target"] == expected_groups
    assert s["sample_key"] == [str(r["ID"]) for r in records]
    [(value, low, high)] = con.execute("SELECT value, ci_low, ci_high FROM metrics WHERE task = 'winogavil' AND "
                                       "metric = 'jaccard_score_10-12'").fetchall()
    assert value == saved["metrics"]["jaccard_score_10-12"] and low <= value <= high
    capsys.readouterr()
    assert main(["cache", "--cache_dir", str(tmp_path / "cache"), "ls", "--json"]) == 0
    listed = {e["role"]: e for e in map(json.loads, capsys.readouterr().out.splitlines())}
    distinct = {i for r in records for i in r["_images"]}
    assert listed.keys() == {"candidate_image", "cue_text"}
    assert listed["candidate_image"]["count"] == len(distinct) and listed["cue_text"]["count"] == len(records)
    # the suite's main metric recomputed from the game rows: a complete one-dataset suite with an interval
    path = tmp_path / "wino.yaml"
    path.write_text("name: wino\ndatasets:\n  - dataset: misc/winogavil\n    task: winogavil\n"
                    "    main_metric: jaccard_score_10-12\n    chance: 0.205\n")
    [score] = score_suite(con, load_suite(str(path)), resamples=200)
    [result] = score.results
    assert result.value == value and result.draws is not None and len(result.draws) == 200
    low, high = score.score_ci
    assert low is not None and high is not None and low <= value <= high
    [line] = map(json.loads, datacomp_jsonl(con, score).splitlines())  # DataComp's eval_results.jsonl line
    assert line["key"] == "misc/winogavil" and line["metrics"] == {**saved["metrics"], "main_metric": value}


def test_compare_pairs_two_checkpoints_game_by_game(tmp_path, capsys):
    """`clipcache compare` over WinoGAViL: each group's mean Jaccard index of the two checkpoints, paired over the same
    games, its interval from resampling every game (no flips: a game's score is not right or wrong)."""
    from conftest import perturbed_tiny_model

    root = write_cache(tmp_path / "data", games())
    perturbed = tmp_path / "perturbed"
    perturbed_tiny_model(perturbed, spread=1.5)  # these games are easy: a larger change of the image tower
    assert cli("eval", root, tmp_path) == 0
    assert main(["eval", "--model", f"local-dir:{perturbed}", "--dataset", "misc/winogavil", "--dataset_root",
                 str(root), "--orchestrator", "local", "--quiet", "--output_dir", str(tmp_path / "out"),
                 "--cache_dir", str(tmp_path / "cache")]) == 0
    saved = {path.relative_to(tmp_path / "out").parts[0]: json.loads(path.read_text())["metrics"]
             for path in (tmp_path / "out").rglob("*winogavil*.json")}
    code, out, err = run_cli(["compare", "--baseline", "tiny-shapes-clip", "--candidate", "perturbed",
                              "--output_dir", str(tmp_path / "out"), "--format", "json"], capsys)
    assert code == 0, err
    rows = {r["metric"]: r for r in json.loads(out)}
    present = {m for m, v in saved["tiny-shapes-clip"].items() if not math.isnan(v)}
    assert rows.keys() == present and "jaccard_score_10-12" in rows
    for metric, row in rows.items():
        assert row["task"] == "winogavil" and row["n"] == len(games())
        assert row["baseline"] == saved["tiny-shapes-clip"][metric] and row["candidate"] == saved["perturbed"][metric]
        assert row["ci_low"] <= row["difference"] <= row["ci_high"]
        assert row["flipped_to_correct"] is None and row["p_value"] is not None
    assert rows["avg_jaccard_score"]["difference"] < 0  # the perturbed image tower is worse


def test_datacomp_suite_runs_winogavil():
    [entry] = [e for e in load_suite("datacomp").datasets if e.dataset == "misc/winogavil"]
    assert entry.runnable and entry.task == "winogavil" and entry.main_metric == "jaccard_score_10-12"
    assert entry.chance == 0.205


@pytest.mark.parametrize("change, phrase", [
    ("no_file", "no winogavil-test.arrow found"),
    ("no_column", "no column 'associations'"),
    ("images", "row 2: 'candidate_images' must hold one image per candidate (10 candidates, 9 images)"),
    ("cue", "row 0: 'cue' must be a non-empty string"),
    ("split", "has one split, 'test'"),
])
def test_bad_input_is_one_line(tmp_path, capsys, change, phrase):
    records = games()[:4]
    if change == "images":
        records[2]["_images"] = records[2]["_images"][:-1]
    if change == "cue":
        records[0]["cue"] = ""
    root = tmp_path / "data"
    if change == "no_file":
        root.mkdir()
    else:
        write_cache(root, records, without="associations" if change == "no_column" else None)
    extra = ("--split", "train") if change == "split" else ()
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", "misc/winogavil", "--dataset_root",
                            str(root), "--orchestrator", "local", "--quiet", "--output_dir", str(tmp_path / "out"),
                            "--cache_dir", str(tmp_path / "cache"), *extra], capsys)
    assert_refused(code, err, phrase)
