"""CLIPScore / RefCLIPScore from the cache (equal to the paper's definitions on open_clip's own embeddings), a
user's captions file, convert's VLM captions scored without calling the VLM, and `clipcache compare` of two
captioners image by image. The bundled tiny CLIP on the shapes images (it knows their colours and shapes)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from test_captioning import run

from clipcache.tasks.contract import DataSource

from conftest import REPO, write_image_queries

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="the COCO caption metrics need Java")


@pytest.fixture(scope="module")
def shapes_clip(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("clipscore")
    data = write_image_queries(root / "data", n=12)
    lines = [json.loads(x) for x in (data / "image_queries.jsonl").read_text().splitlines()]
    return {"root": root, "data": data, "lines": lines, "model": f"local-dir:{tiny_model_dir}"}


def captions_file(path: Path, lines: list[dict], order: list[int]) -> Path:
    path.write_text("".join(json.dumps({"image": Path(lines[i]["image_path"]).name,
                                        "caption": lines[j]["query"][0]}) + "\n"
                            for i, j in zip(range(len(lines)), order, strict=True)))
    return path


def test_clipscore_equals_the_definitions_and_prefers_the_references(shapes_clip):
    """A captioner that writes the first reference scores higher than one whose captions are shuffled; both equal
    CLIPScore and RefCLIPScore computed from the paper's definitions on open_clip's own embeddings."""
    import open_clip
    import torch
    from PIL import Image

    lines, n = shapes_clip["lines"], len(shapes_clip["lines"])
    shuffled = list(np.roll(np.arange(n), 5))
    scores = {}
    for name, order in (("refs", list(range(n))), ("shuffled", shuffled)):
        path = captions_file(shapes_clip["root"] / f"{name}.jsonl", lines, order)
        scores[name], session = run(shapes_clip["model"], shapes_clip["data"], shapes_clip["root"] / "cache",
                                    caption_source=str(path), caption_metrics=["clipscore"])
    assert scores["refs"].metrics["clipscore"] > scores["shuffled"].metrics["clipscore"]
    assert scores["refs"].metrics["refclipscore"] > scores["shuffled"].metrics["refclipscore"]

    model, _, transform = open_clip.create_model_and_transforms(shapes_clip["model"], device="cpu")
    tokenizer = open_clip.get_tokenizer(shapes_clip["model"])
    model.eval()
    with torch.no_grad():
        images = model.encode_image(torch.stack([transform(Image.open(shapes_clip["data"] / line["image_path"])
                                                           .convert("RGB")) for line in lines])).numpy()

        def text(texts):
            return model.encode_text(tokenizer(["A photo depicts " + t for t in texts])).numpy()

        refs = [text(line["query"]) for line in lines]
        for name, order in (("refs", list(range(n))), ("shuffled", shuffled)):
            cands = text([lines[j]["query"][0] for j in order])
            clip_s, ref_clip_s = [], []
            for i in range(n):
                img, cand = images[i] / np.linalg.norm(images[i]), cands[i] / np.linalg.norm(cands[i])
                c = 2.5 * max(float(img @ cand), 0.0)
                r = max(float(cand @ (ref / np.linalg.norm(ref))) for ref in refs[i])
                clip_s.append(c)
                ref_clip_s.append(2 * c * r / (c + r))
            assert scores[name].metrics["clipscore"] == pytest.approx(np.mean(clip_s), abs=1e-5)
            assert scores[name].metrics["refclipscore"] == pytest.approx(np.mean(ref_clip_s), abs=1e-5)


def test_a_captions_file_missing_an_image_is_one_clear_error(shapes_clip):
    from clipcache.storage.errors import DatasetError

    path = shapes_clip["root"] / "short.jsonl"
    lines = shapes_clip["lines"]
    path.write_text(json.dumps({"image": Path(lines[0]["image_path"]).name, "caption": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"short.jsonl: no entry for image .*img1.png"):
        run(shapes_clip["model"], shapes_clip["data"], shapes_clip["root"] / "cache", caption_source=str(path),
            caption_metrics=["clipscore"])
    bad = shapes_clip["root"] / "bad.jsonl"
    bad.write_text('{"image": "img0.png", "captions": ["a"]}\n{"image": ')
    with pytest.raises(DatasetError, match=r"bad.jsonl, line 2: not valid JSON"):
        run(shapes_clip["model"], shapes_clip["data"], shapes_clip["root"] / "cache",
            caption_source=str(captions_file(shapes_clip["root"] / "full.jsonl", lines, list(range(len(lines))))),
            caption_references=str(bad), caption_metrics=["clipscore"])


@needs_java
@pytest.mark.slow  # a local HTTP server (the fake VLM): the full tier's
def test_converts_vlm_captions_are_scored_without_calling_the_vlm(shapes_clip, tmp_path):
    """The captions a VLM wrote through convert (its caption cache) scored against the dataset's references as an
    experiment of their own: the VLM is asked once, by convert, never by the scoring."""
    from clipcache.flows.orchestration.conversion import caption_dataset
    from clipcache.storage.caption_cache import caption_setups
    from clipcache.tasks.convert.captioner import CaptionSettings
    from clipcache.tasks.progress import StageProgress

    sys.path.insert(0, str(REPO / "scripts"))
    from fake_vlm_server import FakeVLMServer

    cache = tmp_path / "cache"
    dataset = DataSource("custom", str(shapes_clip["data"])).open()
    with FakeVLMServer() as vlm:
        settings = CaptionSettings("captioner", vlm.api_base, "Describe this image")
        run_ = caption_dataset(dataset, settings, "sk-test", str(cache), StageProgress(enabled=False))
        assert not run_.failures and vlm.requests == len(dataset)
        (key,) = caption_setups(cache)
        scored, session = run(shapes_clip["model"], shapes_clip["data"], cache, caption_source=f"cache:{key[:10]}",
                              caption_metrics=["cider", "clipscore"])
        again, _ = run(shapes_clip["model"], shapes_clip["data"], cache, caption_source=f"cache:{key[:10]}",
                       caption_metrics=["bleu"], cached_only=True)
        assert vlm.requests == len(dataset)  # convert's requests only
    assert scored.metrics["CIDEr"] > 0.1 and 0 < again.metrics["Bleu_1"]  # the fake VLM describes the shapes
    with pytest.raises(Exception, match="no captioning setup"):
        run(shapes_clip["model"], shapes_clip["data"], cache, caption_source="cache:ffff", caption_metrics=["bleu"])


@pytest.mark.slow  # two CLI runs and a compare (~10-25 s here)
def test_compare_two_captioners_image_by_image_through_the_warehouse(shapes_clip, tmp_path, capsys):
    """Two captioners' experiments (the references' captions vs shuffled ones) through the CLI: the sample rows
    recompute the stored means, and `clipcache compare` finds the shuffled captioner worse per image."""
    from clipcache.flows.cli import main
    from clipcache.storage.warehouse import connect

    from hostile import run_cli

    lines, n = shapes_clip["lines"], len(shapes_clip["lines"])
    dirs = ["--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    for name, order in (("refs", list(range(n))), ("shuffled", list(np.roll(np.arange(n), 5)))):
        path = captions_file(tmp_path / f"{name}.jsonl", lines, order)
        assert main(["eval", "--model", shapes_clip["model"], "--dataset", "custom", "--dataset_root",
                     str(shapes_clip["data"]), "--task", "captioning", "--caption_source", str(path),
                     "--caption_metrics", "clipscore", "--quiet", "--orchestrator", "local", *dirs]) == 0
    con = connect(tmp_path / "out")
    rows = con.sql("""
        SELECT m.experiment_id, m.metric, m.value, avg(s.value) AS mean, count(*) AS n
        FROM metrics m JOIN latest_samples s ON s.experiment_id = m.experiment_id
                                             AND s.unit = 'caption_' || lower(m.metric)
        WHERE m.task = 'captioning' GROUP BY ALL ORDER BY ALL""").fetchall()
    assert len(rows) == 4
    assert all(n_ == n and value == pytest.approx(mean, abs=1e-12) for _, _, value, mean, n_ in rows)
    by_source = {json.loads(o)["caption_source"].rsplit("/", 1)[-1]: e for e, o in con.sql(
        "SELECT DISTINCT experiment_id, task_options FROM metrics WHERE task = 'captioning'").fetchall()}
    code, out, err = run_cli(["compare", "--baseline", by_source["refs.jsonl"], "--candidate",
                              by_source["shuffled.jsonl"], "--output_dir", str(tmp_path / "out"),
                              "--format", "json"], capsys)
    assert code == 0, err
    compared = {r["metric"]: r for r in json.loads(out)}
    assert set(compared) == {"clipscore", "refclipscore"}
    assert compared["clipscore"]["verdict"] == "worse" and compared["clipscore"]["n"] == n
    # each image's caption and references are in its rows, as written: SQL reads them, compare shows both sides
    (refs_id, shuffled_id) = by_source["refs.jsonl"], by_source["shuffled.jsonl"]
    stored = con.sql("SELECT sample_index, caption, reference_captions FROM latest_samples WHERE experiment_id = ? "
                     "AND unit = 'caption_clipscore' ORDER BY sample_index", params=[shuffled_id]).fetchall()
    assert [c for _, c, _ in stored] == [lines[j]["query"][0] for j in np.roll(np.arange(n), 5)]
    assert [r for _, _, r in stored] == [line["query"] for line in lines]
    pairs = con.sql(f"SELECT sample_index, baseline_caption, candidate_caption, baseline_value, candidate_value "
                    f"FROM caption_pairs('{refs_id}', '{shuffled_id}') WHERE unit = 'caption_clipscore'").fetchall()
    assert len(pairs) == n and all(a == lines[i]["query"][0] for i, (_, a, _, _, _) in enumerate(pairs))
    code, out, err = run_cli(["compare", "--baseline", refs_id, "--candidate", shuffled_id, "--output_dir",
                              str(tmp_path / "out"), "--format", "json", "--captions", "3"], capsys)
    assert code == 0, err
    shown = json.loads(out)["captions"]
    gaps = sorted((abs(b - a) for _, _, _, a, b in pairs), reverse=True)
    assert [c["difference"] for c in shown] == pytest.approx([-g for g in gaps[:3]], abs=1e-12)  # worst first
    for c in shown:
        i = c["sample_index"]
        assert (c["metric"], c["baseline_caption"], c["candidate_caption"], c["reference_captions"]) == (
            "clipscore", lines[i]["query"][0], lines[(i - 5) % n]["query"][0], lines[i]["query"])
    code, out, err = run_cli(["compare", "--baseline", refs_id, "--candidate", shuffled_id, "--output_dir",
                              str(tmp_path / "out"), "--captions", "3"], capsys)
    assert code == 0, err
    assert "3 images, the largest clipscore difference first" in out
    for c in shown:  # the table lists the same images with both captions (wrapped in their cells)
        assert c["baseline_caption"][:25] in out and c["candidate_caption"][:25] in out
