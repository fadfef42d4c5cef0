"""The captioning task: a tiny CoCa's captions scored as clip_benchmark's captioning evaluation scores them (its own
``evaluate`` is the oracle), every COCO metric equal to pycocoevalcap run directly, CLIPScore / RefCLIPScore from
the cache equal to the paper's definitions, convert's VLM captions scored without calling the VLM, and rescores that
load no model. Java starts (PTB tokeniser, METEOR) are the cost here: each module fixture runs them once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.contract import CacheMissError, DataSource, EncodeSettings
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.models.spec import ModelSpec

from conftest import write_image_queries

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="the COCO caption metrics need Java")
# METEOR's Java start loads its paraphrase tables (~10-30 s here): the tests that run it are slow (full tier) and
# share one scorer per process (caption_metrics.shared_meteor)
COCO = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"]
TINY_COCA = {  # open_clip's coca_ViT-B-32 shrunk (same towers and vocabulary, 1 layer each, 32 wide, 32 px)
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16,
                   "attentional_pool": True, "attn_pooler_heads": 2, "output_tokens": True},
    "text_cfg": {"context_length": 76, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1, "embed_cls": True,
                 "output_tokens": True},
    "multimodal_cfg": {"context_length": 76, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1,
                       "attn_pooler_heads": 2},
    "custom_text": True,
}


def session_for(model: str):
    from clipcache.flows.orchestration.pipeline import prepare_model

    return prepare_model(ModelSpec(model_name=model), FileHashMemo(None), "cpu", False, None)


def run(model_or_session, data: Path, cache: Path, **options):
    session = session_for(model_or_session) if isinstance(model_or_session, str) else model_or_session
    cached_only = options.pop("cached_only", False)
    scored = evaluate_one("captioning", session, DataSource("custom", str(data)), EmbeddingStore(cache),
                          FileHashMemo(None), encode=EncodeSettings(cached_only=cached_only), options=options)
    return scored, session


def write_tiny_coca(model_dir: Path, *, poisoned: bool = False) -> str:
    """A tiny random CoCa as a local open_clip folder (``poisoned``: its decoder's output projection NaN); returns
    its model spec."""
    import open_clip  # noqa: F401
    import torch
    from open_clip.coca_model import CoCa
    from safetensors.torch import save_file

    model_dir.mkdir(parents=True)
    (model_dir / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_COCA}))
    torch.manual_seed(0)
    module = CoCa(TINY_COCA["embed_dim"], TINY_COCA["multimodal_cfg"], TINY_COCA["text_cfg"], TINY_COCA["vision_cfg"])
    # open_clip 3.3.0's MultimodalTransformer never calls its init_parameters(): its text_projection is torch.empty,
    # whatever memory held before (zeros in a fresh process: every token ties; NaN after other tests: generation
    # fails). It and the projections open_clip starts at zero get seeded noise.
    uninitialised = module.text_decoder.text_projection
    for p in module.parameters():
        if p is uninitialised or (p.ndim >= 2 and not p.any()):
            p.data.normal_(0, 0.5)
    if poisoned:
        uninitialised.data.fill_(float("nan"))
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, model_dir / "open_clip_model.safetensors")
    return f"local-dir:{model_dir}"


@pytest.fixture(scope="module")
def coca(tmp_path_factory):
    """A tiny random CoCa as a local open_clip folder, a 6-image set with 3 references each, and one captioning
    run with every metric (the module's one set of Java starts for the task)."""
    root = tmp_path_factory.mktemp("captioning")
    model = write_tiny_coca(root / "tiny-coca")
    data = write_image_queries(root / "data", n=6)
    scored, session = run(model, data, root / "cache", caption_metrics=["bleu", "rouge", "cider", "spice",
                                                                        "clipscore"])
    return {"root": root, "model": model, "data": data, "cache": root / "cache", "scored": scored,
            "session": session}


def generated_captions(cache: Path) -> list[str]:
    (path,) = (cache / "captions").glob("*.jsonl")
    return [json.loads(line)["caption"] for line in path.read_text().splitlines()]


@needs_java
@pytest.mark.slow
def test_generated_captions_score_as_clip_benchmarks_captioning_task(coca, monkeypatch):
    """clip_benchmark's own captioning.evaluate on the same model, images and decoding: the same captions and the
    same metrics. (Its SPICE needs CoreNLP from nlp.stanford.edu, not reachable here, so the oracle runs with SPICE
    left out; ours leaves it out with a warning and writes no SPICE value.)"""
    import functools

    import open_clip
    import torch
    from clip_benchmark.datasets.builder import image_captions_collate_fn
    from clip_benchmark.metrics import captioning

    from clipcache.tasks.evaluation.caption_sources import ready_to_generate
    from clipcache.tasks.score.caption_metrics import shared_meteor

    ready_to_generate("top_k")  # open_clip 3.3.0 with transformers 5: what our task does before generating
    model, _, transform = open_clip.create_model_and_transforms(coca["model"], device="cpu")
    model.eval()
    # clip_benchmark calls model.generate(images) with open_clip's defaults (beam search, impossible with
    # transformers 5): the same decoding settings as ours, given through the model it is handed
    model.generate = functools.partial(model.generate, generation_type="top_k", top_k=1, top_p=0.1, seq_len=30,
                                       temperature=1.0)
    lines = [json.loads(x) for x in (coca["data"] / "image_queries.jsonl").read_text().splitlines()]
    from PIL import Image

    samples = [(transform(Image.open(coca["data"] / line["image_path"]).convert("RGB")), line["query"])
               for line in lines]
    loader = torch.utils.data.DataLoader(samples, batch_size=64, collate_fn=image_captions_collate_fn)

    seen = {}

    class Recording(captioning.COCOEvalCap):
        def __init__(self, results):
            super().__init__(results)
            seen["results"] = results

    class NoSpice:  # the oracle's SPICE would download CoreNLP; every other scorer is its own
        def compute_score(self, gts, res):
            return 0.0, [0.0] * len(gts)

        def method(self):
            return "SPICE"

    monkeypatch.setattr(captioning, "COCOEvalCap", Recording)
    monkeypatch.setattr(captioning, "Spice", NoSpice)
    monkeypatch.setattr(captioning, "Meteor", shared_meteor)  # pycocoevalcap's METEOR, one Java start per process
    expected = captioning.evaluate(model, loader, 64, "cpu", transform)
    oracle_captions = [r["gen"][0]["caption"] for r in seen["results"]]
    assert generated_captions(coca["cache"]) == oracle_captions
    ours = dict(coca["scored"].metrics)
    assert "SPICE" not in ours
    meteor, _ = run(coca["model"], coca["data"], coca["cache"], cached_only=True, caption_metrics=["meteor"])
    ours.update(meteor.metrics)
    for name in COCO:
        assert ours[name] == pytest.approx(expected[name], abs=1e-12), name


@pytest.fixture(scope="module")
def coco_direct(tmp_path_factory):
    """A small hand-made set with meaningful overlap, scored by us and by pycocoevalcap run directly."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    from clipcache.tasks.score.caption_metrics import coco_caption_scores, shared_meteor

    references = [["A red circle on a black background.", "a small red circle", "red round shape on black"],
                  ["Two dogs run across the grass.", "dogs playing in a park", "two brown dogs running"],
                  ["a man rides a bicycle down the street", "a cyclist on a city road", "man on a bike"],
                  ["a plate of food with rice and beans", "rice, beans and salad on a plate", "a dinner plate"],
                  ["a blue square at the top", "small blue square near the top edge", "blue square, white ground"]]
    candidates = ["a red circle on black", "two dogs running in the grass", "a man riding a bike on the street",
                  "a bowl of soup", "a blue square at the top of the image"]
    ours = coco_caption_scores(references, candidates, ["bleu", "meteor", "rouge", "cider"])
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(references)})
    res = tok.tokenize({i: [{"caption": c}] for i, c in enumerate(candidates)})
    direct = {}
    for scorer, names in ((Bleu(4), COCO[:4]), (shared_meteor(), ["METEOR"]),  # a pycocoevalcap Meteor
                          (Rouge(), ["ROUGE_L"]), (Cider(), ["CIDEr"])):
        score, per = scorer.compute_score(gts, res)
        if len(names) == 1:
            score, per = [score], [per]
        for name, s, p in zip(names, score, per, strict=True):
            direct[name] = (s, list(p))
    return ours, direct


@needs_java
@pytest.mark.slow
def test_every_coco_metric_equals_pycocoevalcap_run_directly(coco_direct):
    ours, direct = coco_direct
    for name in COCO:
        assert ours.metrics[name] == pytest.approx(direct[name][0], abs=1e-12), name
        assert ours.per_image[name] == pytest.approx(direct[name][1], abs=1e-12), name
    assert 0.1 < ours.metrics["CIDEr"] and 0.1 < ours.metrics["Bleu_1"]  # a set where the metrics say something
    # the means of the per-image values where the corpus value is their mean
    for name in ("ROUGE_L", "CIDEr"):
        assert ours.metrics[name] == pytest.approx(np.mean(ours.per_image[name]), abs=1e-12)


def test_spice_is_skipped_with_one_line_when_corenlp_is_missing(caplog):
    from clipcache.tasks.score.caption_metrics import spice_problem

    problem = spice_problem()
    if problem is None:
        pytest.skip("Stanford CoreNLP is installed here: SPICE runs")
    assert "\n" not in problem and "nlp.stanford.edu" in problem


def test_per_image_rows_and_intervals(coca):
    scored = coca["scored"]
    parts = {p.unit: p for p in scored.evidence.parts()}
    assert {"caption_cider", "caption_bleu_4", "caption_rouge_l", "caption_clipscore", "caption_refclipscore"} <= set(
        parts)
    for metric in ("CIDEr", "ROUGE_L", "clipscore", "refclipscore"):
        values = parts["caption_" + metric.lower()].columns["value"]
        assert len(values) == 6
        assert scored.metrics[metric] == pytest.approx(values.mean(), abs=1e-12)
        low, high = scored.evidence.all_intervals()[metric]
        assert low <= scored.metrics[metric] <= high
    assert "Bleu_4" not in scored.evidence.all_intervals()  # corpus BLEU is not a mean of the rows
    # every row carries what was scored: the image's caption and its references
    lines = [json.loads(x) for x in (coca["data"] / "image_queries.jsonl").read_text().splitlines()]
    for part in parts.values():
        assert list(part.columns["caption"]) == generated_captions(coca["cache"])
        assert part.columns["reference_captions"] == [line["query"] for line in lines]


@needs_java
def test_a_rescore_with_other_metrics_and_references_loads_no_model(coca, tmp_path, monkeypatch):
    from clipcache.tasks.datasets.custom import ImageQueriesDataset

    def no_decoding(self, index):
        raise AssertionError("a rescore decoded an image")

    monkeypatch.setattr(ImageQueriesDataset, "load_image", no_decoding)  # the images' keys were kept: none decoded
    refs = tmp_path / "refs.json"
    lines = [json.loads(x) for x in (coca["data"] / "image_queries.jsonl").read_text().splitlines()]
    refs.write_text(json.dumps({Path(line["image_path"]).name: [line["query"][-1]] for line in lines}))
    scored, session = run(coca["model"], coca["data"], coca["cache"], cached_only=True, caption_metrics=["cider"],
                          caption_references=str(refs))
    assert session.loads == 0 and list(scored.metrics) == ["CIDEr"]
    # CLIPScore reads the cached image and caption entries: still no model
    scored, session = run(coca["model"], coca["data"], coca["cache"], cached_only=True,
                          caption_metrics=["clipscore"])
    assert session.loads == 0
    assert scored.metrics["clipscore"] == pytest.approx(coca["scored"].metrics["clipscore"], abs=1e-12)
    # other decoding settings were never generated: a rescore says so instead of loading the model
    with pytest.raises(CacheMissError, match="captions of 6 of 6 images"):
        run(coca["model"], coca["data"], coca["cache"], cached_only=True, caption_metrics=["cider"],
            caption_seq_len=12)
    assert len(generated_captions(coca["cache"])) == 6  # nothing generated by any of these


def test_beam_search_runs_without_transformers_4(coca, tmp_path):
    """open_clip's beam search needs transformers 4; clipcache's own runs here (equal to open_clip's token for
    token: tests/test_captioning_beam.py, opt-in) and its captions are a setup of their own."""
    scored, _ = run(coca["model"], coca["data"], tmp_path / "cache", caption_generation="beam_search",
                    caption_seq_len=8, caption_metrics=["clipscore"])
    (setup,) = (tmp_path / "cache" / "captions").glob("*.setup.json")
    assert json.loads(setup.read_text())["decoding"] == {"generation_type": "beam_search", "seq_len": 8,
                                                         "num_beams": 6, "num_beam_groups": 3, "min_seq_len": 5}
    assert len(generated_captions(tmp_path / "cache")) == 6 and "clipscore" in scored.metrics


def test_without_java_the_coco_metrics_stop_in_one_line(monkeypatch):
    from clipcache.storage.errors import ConfigError
    from clipcache.tasks.score import caption_metrics

    monkeypatch.setattr(caption_metrics.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="need a Java runtime on PATH .* default-jre-headless"):
        caption_metrics.coco_caption_scores([["a cat"]], ["a cat"], ["bleu"])


def test_an_edited_references_file_is_another_experiment(tmp_path):
    from clipcache.tasks.contract import ScoreSettings
    from clipcache.tasks.evaluation import get_task

    task = get_task("captioning")
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"0": ["a cat"]}))
    settings = ScoreSettings(options=task.Options(caption_references=str(refs)))
    first = task.options(settings)
    refs.write_text(json.dumps({"0": ["a dog"]}))
    assert task.options(settings) != first and first["caption_references"] == str(refs)
    assert task.options(ScoreSettings()) == {}  # the reference experiment: default options


def test_a_model_that_generates_nan_stops_in_one_line(tmp_path, capsys):
    """A CoCa whose decoder outputs NaN (open_clip samples the next token from NaN probabilities, which torch
    refuses): one line naming the model and the images, no traceback, no caption cached; and a seq_len that
    open_clip's generate() would assert on is refused before any work."""
    from hostile import assert_refused, run_cli

    model = write_tiny_coca(tmp_path / "nan-coca", poisoned=True)
    data = write_image_queries(tmp_path / "data", n=3)
    argv = ["eval", "--model", model, "--dataset", "custom", "--dataset_root", str(data), "--task",
            "captioning", "--caption_metrics", "clipscore", "--quiet", "--orchestrator", "local",
            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    code, _, err = run_cli(argv, capsys)
    assert_refused(code, err, "cannot write captions: its weights hold NaN or infinite values (generate() failed "
                              "on images 0..2 of custom")
    assert not any(p.read_text() for p in (tmp_path / "cache" / "captions").glob("*.jsonl"))
    code, _, err = run_cli([*argv, "--caption_seq_len", "5"], capsys)
    assert_refused(code, err, "caption_seq_len")


def test_the_generated_captions_are_listed_by_cache_ls(coca, capsys):
    from hostile import run_cli

    code, out, err = run_cli(["cache", "ls", "--json", "--task", "captioning", "--cache_dir", str(coca["cache"])],
                             capsys)
    assert code == 0, err
    (setup,) = [r for r in map(json.loads, out.splitlines()) if r["kind"] == "captions"]
    assert setup["model"] == coca["session"].resolved.display_name == "tiny-coca (tiny-coca@d2a95529)" and setup["count"] == 6
    assert setup["settings"].startswith("generation_type=top_k, seq_len=30, top_p=0.1, top_k=1, temperature=1.0")
