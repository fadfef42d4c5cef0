"""InternVL-C / InternVL-G (``--model_type internvl``) and the ``trust_remote_code`` opt-in, with a tiny random InternVL
folder whose model code (tests/fixtures/tiny_internvl) is written to InternVL's documented interface and loaded
through transformers' real remote-code path (auto_map + trust_remote_code=True).

The seed's commands (InternVL's clip_benchmark README) run as typed there, with the paths of this machine and the
opt-in added; their numbers equal LAION clip_benchmark's evaluation of the same model wired as InternVL's fork wires
it; the vectors equal a direct call of the model's own methods as its model card makes it; without the opt-in the
folder is refused in one line, and a changed code file is a new experiment.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from internvl_fixtures import fork_retrieval_wiring, make_internvl_folder
from layout_fixtures import write_layout, write_mnist
from PIL import Image

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.resolve import load_model, resolve_model
from clipcache.tasks.models.spec import ModelSpec

from hostile import assert_refused, canary_payload, run_cli

FOLDER = "./pretrained/InternVL-14B-224px"
# The seed's commands, as typed there (CUDA_VISIBLE_DEVICES=0 python3 clip_benchmark/cli.py -> clipcache), with
# --pretrained pointing at the Hugging Face folder and the opt-in added.
SEED = {
    "mnist": 'eval --model_type internvl --language "en" --task "zeroshot_classification" --dataset "mnist" '
             '--dataset_root ./data/ --model internvl_c_classification --pretrained {folder} --output result.json',
    "coco_g": 'eval --model_type internvl --language "en" --task "zeroshot_retrieval" --dataset "mscoco_captions" '
              '--dataset_root ./data/mscoco_captions --model internvl_g_retrieval_hf --pretrained {folder} '
              '--output result_g.json',
    "xtd_jp": 'eval --model_type internvl --task "zeroshot_retrieval" --dataset "multilingual_mscoco_captions" '
              '--dataset_root ./data/mscoco_captions --model internvl_c_retrieval --pretrained {folder} '
              '--output result.json --language=jp',
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("internvl")
    make_internvl_folder(root / "pretrained" / "InternVL-14B-224px")
    write_mnist(root / "data")
    write_layout("mscoco_captions", root / "data" / "mscoco_captions")
    write_layout("multilingual_mscoco_captions", root / "data" / "mscoco_captions", language="jp")
    return root


@pytest.fixture
def here(work, monkeypatch):
    monkeypatch.chdir(work)
    return work


def seed_argv(key: str, *extra: str, folder: str = FOLDER) -> list[str]:
    return [*shlex.split(SEED[key].format(folder=folder)), *extra, "--quiet", "--orchestrator", "local"]


def spec(folder: Path, name: str = "internvl_g_retrieval_hf", trust: bool = True) -> ModelSpec:
    return ModelSpec(model_name=name, pretrained=str(folder), model_type="internvl", trust_remote_code=trust)


def images(n: int = 3) -> list[Image.Image]:
    rng = np.random.RandomState(1)
    return [Image.fromarray((rng.rand(30 + 7 * i, 44, 3) * 255).astype("uint8")) for i in range(n)]


# -- the opt-in ----------------------------------------------------------------------------------------------------
def test_without_the_opt_in_the_folder_is_refused_in_one_line(here, capsys):
    code, _, err = run_cli(seed_argv("mnist"), capsys)
    assert_refused(code, err, "asks to run its own Python code")
    assert "--trust_remote_code" in err and not (here / "result.json").exists()


def test_the_pth_form_is_refused_with_the_way_to_the_folder(here, capsys):
    for present in (False, True):  # the seed's path, downloaded or not
        if present:
            (here / "pretrained" / "internvl_c_13b_224px.pth").write_bytes(b"not read")
        code, _, err = run_cli(seed_argv("mnist", "--trust_remote_code",
                                         folder="./pretrained/internvl_c_13b_224px.pth"), capsys)
        assert_refused(code, err, "needs InternVL's own repository code")
        assert "OpenGVLab/InternVL-14B-224px" in err


def test_the_opt_in_does_not_spread_to_another_loader(here):
    with pytest.raises(ModelError, match="the hf loader never runs it"):
        resolve_model(ModelSpec(model_name=str(here / "pretrained" / "InternVL-14B-224px"), model_type="hf",
                                trust_remote_code=True), FileHashMemo(None))


def test_an_evalscope_entry_trusts_only_its_own_model(here, tmp_path):
    """Two model entries: the one with trust_remote_code loads its code; the other, a folder asking for code, is
    still refused (and its code never imported)."""
    from clipcache.flows.config.evalscope import to_evaluate_params

    other = tmp_path / "other"
    make_internvl_folder(other, seed=1)
    (other / "modeling_internvl.py").write_text(canary_payload(tmp_path / "canary") + "\n"
                                                + (other / "modeling_internvl.py").read_text())
    params = to_evaluate_params({"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "internvl_c_classification", "pretrained": FOLDER, "model_type": "internvl",
                    "trust_remote_code": True},
                   {"model_name": "internvl_c_classification", "pretrained": str(other), "model_type": "internvl"}],
        "dataset_name": ["mnist"], "data_dir": "./data"}}})
    trusted, untrusted = params.models
    assert trusted.trust_remote_code and not untrusted.trust_remote_code
    memo = FileHashMemo(None)
    assert resolve_model(trusted, memo).identity["trust_remote_code"] is True
    with pytest.raises(ModelError, match="asks to run its own Python code"):
        resolve_model(untrusted, memo)
    assert not (tmp_path / "canary").exists()


def test_a_changed_code_file_is_a_new_experiment(tmp_path):
    folder = make_internvl_folder(tmp_path / "m")
    before = resolve_model(spec(folder), FileHashMemo(None))
    with open(folder / "modeling_internvl.py", "a") as f:
        f.write("\n# an edit that changes no weight\n")
    after = resolve_model(spec(folder), FileHashMemo(None))
    assert before.identity["code_files"]["configuration_internvl.py"] == \
        after.identity["code_files"]["configuration_internvl.py"]
    assert before.identity["code_files"]["modeling_internvl.py"] != after.identity["code_files"]["modeling_internvl.py"]
    assert before.fingerprint != after.fingerprint and before.checkpoint != after.checkpoint
    assert "+remote-code:" in after.checkpoint


def test_code_changed_between_resolve_and_load_is_refused(tmp_path):
    folder = make_internvl_folder(tmp_path / "m")
    resolved = resolve_model(spec(folder), FileHashMemo(None))
    (folder / "helper.py").write_text("x = 1\n")
    with pytest.raises(ModelError, match="Python files changed"):
        load_model(resolved, torch.device("cpu"), False)


def test_an_auto_map_naming_another_repository_is_refused(tmp_path):
    folder = make_internvl_folder(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModel"] = "someone/else--modeling_internvl.TinyInternVLModel"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="code from another repository"):
        resolve_model(spec(folder), FileHashMemo(None))


# -- the vectors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,mode,crop", [("internvl_g_retrieval_hf", "InternVL-G", False),
                                            ("internvl_c_classification", "InternVL-C", True)])
def test_vectors_equal_a_direct_call_of_the_models_methods(work, name, mode, crop):
    """As the model card calls it: AutoModel with trust_remote_code, CLIPImageProcessor, the slow Llama tokenizer
    with add_eos_token, pad id 0, 'summarize:' prefix, max_length 80; retrieval squashes to the square input."""
    from transformers import AutoModel, AutoTokenizer, CLIPImageProcessor

    folder = work / "pretrained" / "InternVL-14B-224px"
    model = load_model(resolve_model(spec(folder, name), FileHashMemo(None)), torch.device("cpu"), False)
    module = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    processor = CLIPImageProcessor.from_pretrained(folder)
    # add_bos_token as the slow LlamaTokenizer InternVL was trained with adds it: transformers 5 drops the BOS
    # when add_eos_token is given alone, whatever tokenizer_config.json says
    tokenizer = AutoTokenizer.from_pretrained(folder, use_fast=False, add_bos_token=True, add_eos_token=True,
                                              padding_side="right")
    tokenizer.pad_token_id = 0
    texts = ["a photo of a cat.", "汉字 and ü", "a " * 200]
    pics = images()
    kwargs = {} if crop else {"do_center_crop": False, "size": {"height": 32, "width": 32}}
    pixels = processor(images=pics, return_tensors="pt", **kwargs).pixel_values
    ids = tokenizer(["summarize:" + t for t in texts], return_tensors="pt", max_length=80, truncation=True,
                    padding="max_length").input_ids
    assert ids.shape == (3, 80) and ids[:, 0].eq(1).all() and (ids[2, -1] == 2)  # BOS, EOS kept when truncated
    with torch.no_grad():
        direct_images = F.normalize(module.encode_image(pixels, mode=mode), dim=-1).numpy()
        direct_texts = F.normalize(module.encode_text(ids), dim=-1).numpy()
    ours = model.encode_images(torch.stack([model.image_transform(p) for p in pics]))
    np.testing.assert_allclose(ours, direct_images, rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.encode_texts(texts), direct_texts, rtol=0, atol=1e-6)
    assert torch.equal(model.tokenize(texts), ids)


# -- the seed's commands -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(SEED))
def test_the_seeds_commands_run_end_to_end(here, capsys, key):
    words = shlex.split(SEED[key])
    output = here / words[words.index("--output") + 1]
    output.unlink(missing_ok=True)  # another command's file is kept, and this one would get a name of its own
    code, out, err = run_cli(seed_argv(key, "--trust_remote_code"), capsys)
    assert code == 0, err
    result = json.loads(output.read_text())
    assert result["model"] == words[words.index("--model") + 1]
    assert result["pretrained"] == FOLDER
    metrics = result["metrics"]
    assert all(0.0 <= v <= 1.0 for v in metrics.values() if v is not None)
    assert ("acc1" in metrics) == (key == "mnist")
    if key == "xtd_jp":
        assert result["language"] == "jp"


def test_numbers_equal_clip_benchmark_with_the_model_wired_as_internvls_fork_wires_it(here, capsys):
    """LAION clip_benchmark's own dataset reader and retrieval metric, given the model as InternVL's fork gives it
    (encode_image in the G mode, the fork's summarize:/80-token tokenizer, the square-resize transform)."""
    from clip_benchmark.datasets.builder import build_dataset
    from clip_benchmark.metrics import zeroshot_retrieval

    (here / "result_g.json").unlink(missing_ok=True)
    # the fixture has 4 test images: clip_benchmark's torch.topk needs k <= 4
    code, _, err = run_cli(seed_argv("coco_g", "--trust_remote_code", "--recall_k", "1", "2", "3"), capsys)
    assert code == 0, err
    ours = json.loads((here / "result_g.json").read_text())["metrics"]

    model, tokenize, transform = fork_retrieval_wiring(FOLDER, "InternVL-G")
    ds = build_dataset(dataset_name="mscoco_captions", root="./data/mscoco_captions", transform=transform,
                       split="test", download=False, task="zeroshot_retrieval")
    from clip_benchmark.datasets.builder import get_dataset_collate_fn

    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=False, num_workers=0,
                                         collate_fn=get_dataset_collate_fn("mscoco_captions"))
    theirs = zeroshot_retrieval.evaluate(model, loader, tokenize, "cpu", amp=False, recall_k_list=[1, 2, 3])
    assert len(theirs) == 6
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-9), key


# -- languages ----------------------------------------------------------------------------------------------------
def test_imagenet_class_names_in_the_seeds_languages(here, capsys, tmp_path):
    """--language cn jp ar it: the ImageNet class names and templates of each language (clip_benchmark's), here on
    a six-class ImageNet-A webdataset (the full 1,000 classes cost minutes with a byte-level tiny tokenizer)."""
    from clipcache.tasks.datasets.clip_benchmark.languages import imagenet_prompts

    from conftest import write_wds

    root = write_wds(tmp_path / "imagenet-a", "classification", 12, shards=1, n_classes=6)
    names = imagenet_prompts()["en"]["classnames"]
    (root / "classnames.txt").write_text("\n".join(names[:6]) + "\n")
    code, _, err = run_cli(["eval", "--model_type", "internvl", "--model", "internvl_c_classification",
                            "--pretrained", FOLDER, "--trust_remote_code", "--dataset", "wds/imagenet-a",
                            "--dataset_root", str(root), "--language", "en", "cn", "jp", "ar", "it",
                            "--output", str(tmp_path / "{language}.json"), "--quiet", "--orchestrator", "local"],
                           capsys)
    assert code == 0, err
    results = {lang: json.loads((tmp_path / f"{lang}.json").read_text()) for lang in ("en", "cn", "jp", "ar", "it")}
    assert all(r["language"] == lang for lang, r in results.items())
    # five prompt sets, five classifiers: the scores differ (a random model, so not in quality)
    assert len({json.dumps(r["metrics"], sort_keys=True) for r in results.values()}) > 1
    prompts = {}
    for path in (here / "outputs" / "internvl_c_classification").rglob("*.json"):
        experiment = json.loads(path.read_text()).get("experiment", {})
        if experiment.get("dataset") == "wds/imagenet-a":
            prompts[experiment["language"]] = experiment["prompts"]
    assert set(prompts) == {"en", "cn", "jp", "ar", "it"} and len(set(prompts.values())) == 5


# -- the seed's numbers as a published table --------------------------------------------------------------------------
def test_the_shipped_table_holds_the_seeds_numbers():
    import csv

    from clipcache.tasks.suites import load_suite
    from clipcache.tasks.suites.exports import published_table

    rows = {r["name"]: r for r in csv.DictReader(published_table("internvl").open(encoding="utf-8"))}
    assert float(rows["internvl_c_classification"]["ImageNet-1K"]) == 0.83178  # the seed's acc1
    assert float(rows["internvl_c_classification"]["ImageNet-1K (AR)"]) == 0.4486
    # XTD: the mean of the seed's two recall@10 values; Flickr30K: of its two recall@1 values
    assert float(rows["internvl_g_retrieval_hf"]["XTD (EN)"]) == pytest.approx((0.9829999804496765 +
                                                                                0.9860000014305115) / 2)
    assert float(rows["internvl_c_retrieval"]["Flickr30K"]) == pytest.approx((0.8166000247001648 +
                                                                               0.9470000267028809) / 2)
    suite = load_suite("internvl")
    assert {e.label for e in suite.datasets} == set(rows["internvl_c_classification"]) - {"name", "pretrained"}


def test_suite_check_lines_a_run_up_with_the_published_table(here, capsys):
    (here / "result.json").unlink(missing_ok=True)
    code, _, err = run_cli(seed_argv("mnist", "--trust_remote_code"), capsys)
    assert code == 0, err
    ours = json.loads((here / "result.json").read_text())["metrics"]["acc1"]
    code, out, err = run_cli(["suite", "check", "internvl", "--published", "internvl", "--format", "json",
                              "--bootstrap", "0"], capsys)
    assert code == 0, err
    rows = json.loads(out)
    mnist = [r for r in rows if r["dataset"] == "mnist"]
    assert len(mnist) == 1 and mnist[0]["model"] == "internvl_c_classification"
    assert mnist[0]["pretrained"].startswith("InternVL-14B-224px@")  # the folder, named with its content hash
    assert mnist[0]["published"] == 0.806 and mnist[0]["ours"] == pytest.approx(ours)
    assert {r["verdict"] for r in rows if r["dataset"] == "imagenet1k"} == {"not run here"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp", [False, True])
def test_on_cuda_fp32_and_fp16_weights(work, amp):
    """On CUDA: fp32 equals the CPU's closely; --amp loads the weights in fp16 (as InternVL's fork does) and stays
    near fp32. Not run where there is no GPU."""
    folder = work / "pretrained" / "InternVL-14B-224px"
    resolved = resolve_model(spec(folder), FileHashMemo(None))
    cpu = load_model(resolved, torch.device("cpu"), False)
    cuda = load_model(resolved, torch.device("cuda"), amp)
    assert next(cuda.module.parameters()).dtype == (torch.float16 if amp else torch.float32)
    pixels = torch.stack([cpu.image_transform(p) for p in images()])
    texts = ["a photo of a cat.", "汉字 and ü"]
    tolerance = 2e-2 if amp else 1e-4
    np.testing.assert_allclose(cuda.encode_images(pixels), cpu.encode_images(pixels), atol=tolerance)
    np.testing.assert_allclose(cuda.encode_texts(texts), cpu.encode_texts(texts), atol=tolerance)
