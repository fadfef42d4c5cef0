"""visual_sts (MIEB's VisualSTS): rendered-text pairs in both layouts, scored equal to mteb's own STS12VisualSTS
evaluation on the same cached embeddings; the correlations on hand-computed cases; the bootstrap statistic against
scipy; warehouse rows that recompute the stored correlations; a rescore that loads no model; bad input in one line."""

from __future__ import annotations

import io
import json
import math
import re

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont
from scipy.stats import pearsonr, spearmanr

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import check_name, default_task
from clipcache.tasks.datasets.mieb.mieb_layouts import open_visual_sts
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.sts import correlation_statistic, pair_similarities, sts_correlations

NAMES = [f"{side}_{kind}" for side in ("cosine", "manhattan", "euclidean") for kind in ("spearman", "pearson")]
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "orange": (240, 130, 20)}
WORDS = ("circle", "square", "cross")


def render(colour: str, word: str) -> Image.Image:
    """The sentence "a <colour> <word>" drawn in that colour: one word a line, as the tiny model's 64 pixels allow."""
    image = Image.new("RGB", (64, 64), (245, 245, 245))
    draw = ImageDraw.Draw(image)
    for line, text in enumerate(("a", colour, word)):
        draw.text((3, 3 + 19 * line), text, fill=COLOURS[colour], font=ImageFont.load_default(size=15))
    return image


def sentence_pairs(n: int, seed: int = 1) -> list[tuple[tuple[str, str], tuple[str, str], float]]:
    """Gold similarity 0..5: half for the same colour, half for the same shape word."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        (c1, c2), (w1, w2) = rng.choice(list(COLOURS), 2), rng.choice(WORDS, 2)
        pairs.append(((str(c1), str(w1)), (str(c2), str(w2)), 2.5 * (c1 == c2) + 2.5 * (w1 == w2)))
    return pairs


def write_pairs(root, n=16):
    """The pairs.jsonl layout: each distinct sentence one PNG, shared by the pairs that use it."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for k, (a, b, gold) in enumerate(sentence_pairs(n)):
        for colour, word in (a, b):
            render(colour, word).save(root / f"{colour}_{word}.png")
        lines.append(json.dumps({"id": f"p{k}", "image1": f"{a[0]}_{a[1]}.png", "image2": f"{b[0]}_{b[1]}.png",
                                 "score": gold}))
    (root / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    return root


def write_parquet(root, n=20):
    """MIEB's layout: the hub dataset's Parquet file (mteb/rendered-sts12), image structs with HF's metadata."""
    import datasets

    def png(colour, word):
        buf = io.BytesIO()
        render(colour, word).save(buf, format="PNG")
        return {"bytes": buf.getvalue(), "path": None}

    rows = sentence_pairs(n, seed=2)
    features = datasets.Features({"sentence1": datasets.Image(), "sentence2": datasets.Image(),
                                  "score": datasets.Value("float64")})
    table = datasets.Dataset.from_dict({"sentence1": [png(*a) for a, _, _ in rows],
                                        "sentence2": [png(*b) for _, b, _ in rows],
                                        "score": [g for _, _, g in rows]}, features=features)
    (root / "data").mkdir(parents=True)
    table.to_parquet(str(root / "data" / "test-00000-of-00001.parquet"))
    return root


def session():
    memo = FileHashMemo(None)
    return ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                        amp=False, precision="fp32"), memo


# -- the metric --------------------------------------------------------------------------------------------------
def test_correlations_on_hand_computed_cases():
    similarities = pair_similarities(np.array([[1, 0], [3, 4]], np.float32), np.array([[0, 1], [3, 4]], np.float32))
    assert similarities["cosine"].tolist() == [0, 1] and similarities["manhattan"].tolist() == [-2, 0]
    assert similarities["euclidean"].tolist() == pytest.approx([-math.sqrt(2), 0])
    # ties in the gold scores: average ranks (1.5, 1.5, 3) against (1, 2, 3): rho = sqrt(3) / 2, and so is r
    metrics = sts_correlations([1, 1, 3], {"cosine": np.array([0.2, 0.4, 0.6], np.float32)})
    assert metrics == pytest.approx({"cosine_spearman": math.sqrt(3) / 2, "cosine_pearson": math.sqrt(3) / 2})
    # two pairs: a perfect (negative) correlation
    assert sts_correlations([0, 5], {"cosine": np.array([0.9, 0.1])}) == pytest.approx(
        {"cosine_spearman": -1, "cosine_pearson": -1})
    # constant gold scores: undefined, NaN as scipy (and so mteb) gives it, no warning raised
    constant = sts_correlations([3, 3, 3], pair_similarities(np.eye(3, dtype=np.float32), np.ones((3, 3), np.float32)))
    assert sorted(constant) == sorted(NAMES) and all(math.isnan(v) for v in constant.values())


def test_bootstrap_statistic_is_scipy_on_every_resample():
    rng = np.random.default_rng(0)
    gold = np.round(rng.uniform(0, 5, 300), 1)  # many ties
    cosine = (gold + rng.normal(0, 2, 300)).astype(np.float32).astype(np.float64)
    cosine[:40] = cosine[0]
    idx = rng.integers(0, 300, (70, 300))  # more than one sub-block
    idx[3] = 7  # one unit drawn every time: constant, undefined
    for ranks, reference in ((True, spearmanr), (False, pearsonr)):
        got = correlation_statistic(gold, cosine, ranks=ranks)(idx)
        assert math.isnan(got[3])
        expected = np.array([reference(gold[i], cosine[i])[0] if len(set(gold[i])) > 1 else np.nan for i in idx])
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


# -- parity with mteb ----------------------------------------------------------------------------------------------
def test_equal_to_mteb_sts12_visual_sts_on_the_cached_embeddings(tmp_path):
    import datasets
    import mteb
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.timing import TimingStack

    root = write_parquet(tmp_path / "rendered-sts12")
    check_name("sts12", str(root))
    assert default_task("sts12", str(root)) == "visual_sts"
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    scored = evaluate_one("visual_sts", model_session, DataSource("sts12", str(root)), store, memo,
                          encode=EncodeSettings(8, 0))
    [key] = store.keys()  # both sides in one entry
    vectors = store.open(key).raw_embeddings("test")  # what mteb's CLIP-style wrappers give: raw features
    data = open_visual_sts("sts12", root, "test", None)
    distinct = {(colour, word) for a, b, _ in sentence_pairs(20, seed=2) for colour, word in (a, b)}
    assert len(vectors) == len(data.images) == len(distinct) < 40  # each distinct image encoded once
    by_pixels = {}
    for i in range(len(data.images)):
        image = data.images.load_image(i)
        by_pixels[image.size, image.tobytes()] = vectors[i]

    class CachedEncoder(AbsEncoder):
        """mteb's encoder interface over the cache: each image's cached vector."""

        def __init__(self):
            pass

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            return np.stack([by_pixels[image.size, image.tobytes()] for batch in inputs for image in batch["image"]])

    split = datasets.Dataset.from_parquet(str(root / "data" / "test-00000-of-00001.parquet"))
    theirs = mteb.get_task("STS12VisualSTS")._evaluate_subset(
        CachedEncoder(), split, encode_kwargs={"batch_size": 8}, hf_split="test", hf_subset="default",
        timer=TimingStack())
    assert {name: scored.metrics[name] for name in NAMES} == {name: theirs[name] for name in NAMES}  # bit for bit
    assert scored.metrics["cosine_spearman"] > 0.3 and scored.n_samples == 20  # the model sees the colours


# -- end to end ----------------------------------------------------------------------------------------------------
def cli(command, root, tmp_path, *extra):
    return main([command, "--model", "tiny-shapes-clip", "--dataset", "pairs", "--dataset_root", str(root),
                 "--task", "visual_sts", "--orchestrator", "local", "--quiet", "--output_dir", str(tmp_path / "out"),
                 "--cache_dir", str(tmp_path / "cache"), *extra])


def test_cli_warehouse_rows_recompute_the_metrics_and_rescore_loads_no_model(tmp_path, capsys, monkeypatch):
    root = write_pairs(tmp_path / "pairs")
    assert cli("eval", root, tmp_path) == 0
    saved = json.loads((tmp_path / "out" / "tiny-shapes-clip" / "pairs_visual_sts.json").read_text())
    assert saved["task"] == "visual_sts" and set(saved["metrics"]) == set(NAMES)
    con = connect(str(tmp_path / "out"))
    rows = {m: (v, lo, hi) for m, v, lo, hi in con.execute(
        "SELECT metric, value, ci_low, ci_high FROM metrics WHERE task = 'visual_sts'").fetchall()}
    assert {m: v for m, (v, _, _) in rows.items()} == saved["metrics"]
    table = con.sql("SELECT * FROM latest_samples WHERE task = 'visual_sts' AND unit = 'pair' "
                    "ORDER BY sample_index").to_arrow_table().to_pydict()
    assert table["sample_index"] == list(range(16)) and table["sample_key"][:2] == ["p0", "p1"]
    gold, cosine = table["value"], table["score"]
    assert gold == [g for _, _, g in sentence_pairs(16)]
    # the stored correlations, exactly, from the rows: ranks do not see the normalisation, Pearson's r is taken on
    # gold / 5 as mteb normalises it
    assert float(spearmanr(gold, cosine)[0]) == rows["cosine_spearman"][0]
    assert float(pearsonr([g / 5 for g in gold], cosine)[0]) == rows["cosine_pearson"][0]
    for name in ("cosine_spearman", "cosine_pearson"):
        value, low, high = rows[name]
        assert low <= value <= high and low < high
    assert all(lo is None for m, (_, lo, _) in rows.items() if not m.startswith("cosine"))
    capsys.readouterr()
    assert main(["cache", "--cache_dir", str(tmp_path / "cache"), "ls", "--json"]) == 0
    [entry] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert entry["tasks"] == ["visual_sts"] and entry["count"] == len(list(root.glob("*.png"))) < 32

    def no_model(*args, **kwargs):
        raise AssertionError("rescore loaded the model")

    monkeypatch.setattr("clipcache.tasks.encode.stage.load_model", no_model)
    assert cli("rescore", root, tmp_path, "--output_dir", str(tmp_path / "again")) == 0
    again = json.loads((tmp_path / "again" / "tiny-shapes-clip" / "pairs_visual_sts.json").read_text())
    assert again["metrics"] == saved["metrics"]


@pytest.mark.parametrize("damage, message", [
    ("missing_image", r"pairs.jsonl line 2: image2 'nope.png' not found \(paths are relative to "),
    ("not_json", r"pairs.jsonl line 17: not valid JSON"),
    ("no_score", r"pairs.jsonl line 17: expected an object with 'image1' and 'image2' and 'score'"),
    ("text_score", r"pairs.jsonl line 17: 'score' must be a finite number \(got 'high'\)"),
    ("one_pair", r"visual STS needs at least 2 pairs to correlate, 1 to score"),
    ("parquet_columns", r"test-00000-of-00001.parquet: not a visual STS set \(no column sentence2"),
])
def test_bad_input_is_one_line(tmp_path, capsys, damage, message):
    root = write_pairs(tmp_path / "pairs")
    pairs = root / "pairs.jsonl"
    lines = pairs.read_text().splitlines()
    if damage == "missing_image":
        lines[1] = json.dumps({"image1": "red_circle.png", "image2": "nope.png", "score": 1})
    elif damage == "not_json":
        lines.append("{not json")
    elif damage == "no_score":
        lines.append(json.dumps({"image1": "a.png", "image2": "b.png"}))
    elif damage == "text_score":
        lines.append(json.dumps({"image1": "a.png", "image2": "b.png", "score": "high"}))
    elif damage == "one_pair":
        lines = lines[:1]
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pairs.unlink()
        (root / "data").mkdir()
        pq.write_table(pa.table({"sentence1": [b"x"], "score": [1.0]}), root / "data" / "test-00000-of-00001.parquet")
    if pairs.exists():
        pairs.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert cli("eval", root, tmp_path) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_limit_takes_the_first_pairs_and_the_jsonl_layout_has_one_split(tmp_path):
    root = write_pairs(tmp_path / "pairs")
    data = open_visual_sts("pairs", root, "test", 3)
    assert len(data.gold) == 3 and data.pairs.shape == (3, 2) and data.keys == ["p0", "p1", "p2"]
    assert len(data.images) == len({p for pair in data.pairs.tolist() for p in pair})
    with pytest.raises(DatasetError, match=r"pairs.jsonl holds one split, 'test' \(asked for 'train'\)"):
        open_visual_sts("pairs", root, "train", None)
    with pytest.raises(DatasetError, match="neither pairs.jsonl nor MIEB's Parquet files"):
        open_visual_sts("pairs", tmp_path, "test", None)


def test_a_pair_with_an_undecodable_image_leaves_the_set(tmp_path):
    root = write_pairs(tmp_path / "pairs")
    (root / "red_circle.png").write_bytes(b"not an image")
    uses = [k for k, (a, b, _) in enumerate(sentence_pairs(16)) if ("red", "circle") in (a, b)]
    model_session, memo = session()
    scored = evaluate_one("visual_sts", model_session, DataSource("pairs", str(root)),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(8, 0, "skip"))
    assert scored.metrics["skipped_images"] == 1 and uses and scored.n_samples == 16 - len(uses)
    assert not set(uses) & set(scored.evidence.columns["sample_index"].tolist())
