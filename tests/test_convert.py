"""Convert: caption images through an OpenAI-compatible API (a real local HTTP server, the real openai client) into
BEIR files that the real `beir` loader reads."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hub_server import HubServer

from clipcache.storage.caption_cache import CaptionCache
from clipcache.storage.errors import VLMRequestError

from conftest import REPO, write_image_queries, write_wds

sys.path.insert(0, str(REPO / "scripts"))
from fake_vlm_server import FakeVLMServer  # noqa: E402

SECRET = "sk-test-SECRET-0123456789"


@pytest.fixture
def vlm():
    with FakeVLMServer() as server:
        yield server


def seed_config(api_base, tmp_path, **eval_overrides):
    """evalscope's image_caption example, as in seeds/000 and seeds/001 (api_base points at the local server)."""
    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "internvl2-8b", "api_base": api_base, "api_key": SECRET,
                    "prompt": "Describe this image in English"}],
        "dataset_name": ["muge"], "split": "test", "task": "image_caption", "batch_size": 2, "num_workers": 1,
        "verbose": False, "skip_existing": False, "limit": 10,
        "output_dir": str(tmp_path / "outputs"), "cache_dir": str(tmp_path / "cache")}}}
    cfg["eval_config"]["eval"].update(eval_overrides)
    return cfg


@pytest.fixture
def muge_hub(tmp_path, monkeypatch):
    served = tmp_path / "served"
    write_wds(served / "clip-benchmark" / "wds_muge", "retrieval", 16, shards=1)
    with HubServer(served) as hub:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
        yield hub


def test_seed_config_runs_unchanged_and_beir_loads_it(prefect_server, vlm, muge_hub, tmp_path):
    from beir.datasets.data_loader import GenericDataLoader

    from clipcache import run_task

    [result] = run_task(seed_config(vlm.api_base, tmp_path))
    folder = tmp_path / "outputs" / "internvl2-8b" / "muge" / "retrieval_data"
    assert result["metrics"]["conversion_successful"] and result["metrics"]["save_path"] == str(folder)
    saved = json.loads((tmp_path / "outputs" / "internvl2-8b" / "muge_image_caption.json").read_text())
    assert saved["task"] == "image_caption" and saved["metrics"]["n_corpus"] == 10
    corpus, queries, qrels = GenericDataLoader(data_folder=str(folder)).load(split="test")
    assert len(corpus) == 10 and len(queries) == saved["metrics"]["n_queries"] > 10  # several captions per image
    assert set(corpus).isdisjoint(queries)  # ids never collide
    assert all(doc in corpus for rel in qrels.values() for doc in rel)
    assert sum(len(r) for r in qrels.values()) == len(queries)
    mteb = [json.loads(line) for line in (folder / "qrels.jsonl").read_text().splitlines()]
    assert {(r["query-id"], r["corpus-id"]) for r in mteb} == {(q, d) for q, rel in qrels.items() for d in rel}
    # the prompt is user text next to the image, not a system message
    messages = vlm.bodies[0]["messages"]
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"][0] == {"type": "text", "text": "Describe this image in English"}
    assert messages[0]["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert "on a" in next(iter(corpus.values()))["text"]  # a real caption of the image


def convert(tmp_path, api_base, data_dir, **model):
    from clipcache.flows.config.convert_params import ConvertParams
    from clipcache.flows.orchestration.flows import convert as convert_flow

    spec = {"model_name": "captioner", "api_base": api_base, "api_key": SECRET, "max_retries": 3, **model}
    params = ConvertParams(models=[spec], datasets=["custom"], dataset_root=str(data_dir), verbose=False,
                           output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    return convert_flow(params)[0]["metrics"]


def test_transient_errors_are_retried_honouring_retry_after(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=4)
    vlm.fail_next = [429, 500, 503, 408]  # all four hit the first image (one request at a time)
    # each with Retry-After: 0.1 (without one, a retry waits the exponential backoff: 0.5 s x 2^n, ~7 s for these
    # four; test_images_failing_after_all_retries_are_listed_not_captioned and the non-JSON body test wait it)
    vlm.retry_after = "0.1"
    m = convert(tmp_path, vlm.api_base, data, concurrency=1, max_retries=4)
    assert m["conversion_successful"] and m["api_calls"] == 4 + 4 and m["n_corpus"] == 4
    assert all(later - earlier >= 0.1 for earlier, later in zip(vlm.times[:4], vlm.times[1:5], strict=True))  # waited


def test_fatal_status_fails_fast_naming_model_and_status(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=6)
    vlm.always_status = 401
    with pytest.raises(VLMRequestError, match="'captioner' at .* answered HTTP 401"):
        convert(tmp_path, vlm.api_base, data, concurrency=2)
    assert vlm.requests <= 2  # nothing retried, nothing further sent
    assert not (tmp_path / "out" / "captioner" / "custom" / "retrieval_data").exists()


def test_images_failing_after_all_retries_are_listed_not_captioned(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=3)
    vlm.fail_next = [500, 500]  # the first image's request and its one retry
    m = convert(tmp_path, vlm.api_base, data, concurrency=1, max_retries=1)
    assert not m["conversion_successful"] and m["n_failed"] == 1 and "img0.png" in m["failed"][0]["image"]
    assert "HTTP 500 after 2 attempts" in m["failed"][0]["error"]
    # what it has goes beside the result, never as the result
    assert not (tmp_path / "out" / "captioner" / "custom" / "retrieval_data").exists()
    corpus = (tmp_path / "out" / "captioner" / "custom" / "retrieval_data.incomplete" / "corpus.jsonl").read_text()
    assert "doc-0" not in corpus and "500" not in corpus and m["n_corpus"] == 2
    assert not (tmp_path / "out" / "captioner" / "custom_image_caption.json").exists()
    assert (tmp_path / "out" / "captioner" / "custom_image_caption.incomplete.json").exists()
    again = convert(tmp_path, vlm.api_base, data, concurrency=1, max_retries=1)  # only the failed image is asked
    assert again["conversion_successful"] and again["api_calls"] == 1 and again["from_cache"] == 2
    assert (tmp_path / "out" / "captioner" / "custom" / "retrieval_data" / "corpus.jsonl").exists()
    assert not (tmp_path / "out" / "captioner" / "custom" / "retrieval_data.incomplete").exists()


def test_a_failed_reconversion_never_replaces_a_good_result(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=4)
    assert convert(tmp_path, vlm.api_base, data)["conversion_successful"]
    folder = tmp_path / "out" / "captioner" / "custom" / "retrieval_data"
    good = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    vlm.always_status = 503  # the API is down now; another prompt, so nothing comes from the cache
    m = convert(tmp_path, vlm.api_base, data, prompt="Describe the colours", max_retries=1)
    assert m["n_failed"] == 4 and m["n_corpus"] == 0 and m["save_path"] is None
    assert {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == good  # untouched
    assert not folder.with_name("retrieval_data.incomplete").exists()  # nothing empty poses as a result


def test_a_body_that_is_not_json_is_retried(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=2)
    vlm.malformed_next = 2
    m = convert(tmp_path, vlm.api_base, data, concurrency=1, max_retries=3)
    assert m["conversion_successful"] and m["api_calls"] == 2 + 2


def test_a_hanging_server_times_out(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=1)
    vlm.hang = True
    m = convert(tmp_path, vlm.api_base, data, timeout=0.5, max_retries=1)
    assert m["n_failed"] == 1 and "APITimeoutError" in m["failed"][0]["error"]


def test_a_hung_api_costs_the_conversion_at_most_its_stall_timeout(prefect_server, vlm, tmp_path):
    import time

    data = write_image_queries(tmp_path / "d", n=6)
    vlm.hang = True  # per request: 2 s timeout x 21 attempts, about 40 s an image; the stall timeout cuts it to ~1 s
    started = time.monotonic()
    m = convert(tmp_path, vlm.api_base, data, timeout=2, max_retries=20, concurrency=2, stall_timeout=1)
    assert time.monotonic() - started < 15
    assert m["stalled"] and m["n_failed"] == 6 and not m["conversion_successful"]
    assert all("no caption for 1 s (stall_timeout)" in f["error"] for f in m["failed"])
    vlm.hang = False  # the API is back: the same conversion finishes
    again = convert(tmp_path, vlm.api_base, data)
    assert again["conversion_successful"] and not again["stalled"]


def test_identical_conversions_at_once_ask_for_each_caption_once(vlm, tmp_path):
    """Two processes converting the same data with the same captioner share the captions in flight: each image is
    asked for by one of them, and the other reads its caption from the cache file."""
    import subprocess

    data = write_image_queries(tmp_path / "d", n=16)
    vlm.delay = 0.2
    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "captioner", "api_base": vlm.api_base, "api_key": SECRET, "concurrency": 2}],
        "dataset_name": ["custom"], "data_dir": str(data), "task": "image_caption", "verbose": False,
        "cache_dir": str(tmp_path / "cache")}}}
    procs = []
    for i in range(2):
        cfg["eval_config"]["eval"]["output_dir"] = str(tmp_path / f"out{i}")
        (tmp_path / f"cfg{i}.json").write_text(json.dumps(cfg))
        procs.append(subprocess.Popen([str(Path(sys.executable).parent / "clipcache"), "run",
                                       str(tmp_path / f"cfg{i}.json")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PREFECT_HOME": str(tmp_path / f"prefect{i}")}))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    assert vlm.requests == 16  # not 32
    corpora = [(tmp_path / f"out{i}" / "captioner" / "custom" / "retrieval_data" / "corpus.jsonl").read_text()
               for i in range(2)]
    assert corpora[0] == corpora[1]
    shared = [json.loads((tmp_path / f"out{i}" / "captioner" / "custom_image_caption.json").read_text())["metrics"]
              for i in range(2)]
    assert sum(m["api_calls"] for m in shared) == 16  # between them, once per image
    assert all(m["api_calls"] + m["from_other_runs"] + m["from_cache"] == 16 for m in shared)


def test_rerun_makes_zero_calls_and_a_longer_run_only_the_new_ones(prefect_server, vlm, tmp_path):
    data = write_image_queries(tmp_path / "d", n=8)
    first = convert(tmp_path, vlm.api_base, data)
    assert first["api_calls"] == 8
    again = convert(tmp_path, vlm.api_base, data)
    assert again["api_calls"] == 0 and again["from_cache"] == 8
    other_prompt = convert(tmp_path, vlm.api_base, data, prompt="Describe the colours")
    assert other_prompt["api_calls"] == 8  # a different prompt is a different caption


def test_caption_cache_survives_a_torn_line(tmp_path):
    cache = CaptionCache(tmp_path, {"model": "m"})
    cache.put("a" * 64, "first")
    with open(cache.path, "a") as f:
        f.write('{"image": "bbbb", "cap')  # killed mid-write
    reopened = CaptionCache(tmp_path, {"model": "m"})
    reopened.put("c" * 64, "third")
    final = CaptionCache(tmp_path, {"model": "m"})
    assert final.get("a" * 64) == "first" and final.get("c" * 64) == "third" and len(final) == 2


def test_the_api_key_never_lands_anywhere(prefect_server, vlm, muge_hub, tmp_path, monkeypatch):
    import os

    from clipcache import run_task

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run_task(seed_config(vlm.api_base, tmp_path))
    assert all(a == f"Bearer {SECRET}" for a in vlm.authorizations)  # it did reach the server
    places = [tmp_path, Path(os.environ["PREFECT_HOME"])]
    for place in places:
        for path in place.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
    # ... nor the environment-variable route
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    cfg = seed_config(vlm.api_base, tmp_path, limit=12)
    del cfg["eval_config"]["eval"]["models"][0]["api_key"]
    run_task(cfg)
    for place in places:
        for path in place.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_missing_key_and_classification_dataset_are_clear_errors(prefect_server, vlm, tmp_path, monkeypatch):
    from clipcache import run_task
    from clipcache.storage.errors import ConfigError, DatasetError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = seed_config(vlm.api_base, tmp_path)
    del cfg["eval_config"]["eval"]["models"][0]["api_key"]
    with pytest.raises(ConfigError, match="models.0.api_key: no API key"):
        run_task(cfg)
    with pytest.raises(DatasetError, match="does not fit dataset 'shapes'"):
        run_task(seed_config(vlm.api_base, tmp_path, dataset_name=["shapes"]))
    with pytest.raises(ConfigError, match="eval_config.eval.models.0.prompt_text: unknown key"):
        bad = seed_config(vlm.api_base, tmp_path)
        bad["eval_config"]["eval"]["models"][0]["prompt_text"] = "x"
        run_task(bad)


def test_the_cli_exits_non_zero_when_images_failed_and_says_how_to_finish(vlm, muge_hub, tmp_path, capsys):
    import yaml

    from clipcache.flows.cli import main

    cfg = tmp_path / "convert.yaml"
    config = seed_config(vlm.api_base, tmp_path, limit=3)
    config["eval_config"]["eval"]["models"][0]["max_retries"] = 1
    cfg.write_text(yaml.safe_dump(config))
    vlm.always_status = 503  # the API is down for this first run
    assert main(["run", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "1 conversion(s) incomplete" in err and f"clipcache run {cfg}" in err and SECRET not in err
    vlm.always_status = None
    assert main(["run", str(cfg)]) == 0  # the same command finishes it
