"""The cache as the product: re-score without re-encoding, shared prompts, every key field, crash and concurrency
safety with real processes, damage detection, and the `clipcache cache` commands."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from clipcache.flows.cli import main
from clipcache.flows.config.params import EvaluateParams
from clipcache.flows.orchestration.flows import evaluate, rescore
from clipcache.storage.embedding_store import EmbeddingStore, entry_key
from clipcache.storage.errors import CacheIntegrityError, ClipcacheError
from clipcache.storage.hashing import FileHashMemo
from clipcache.storage.text_pool import TextPool
from clipcache.tasks.datasets.shapes import CLASSNAMES
from clipcache.tasks.encode.stage import ModelSession, encode_prompts, image_key_fields
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.progress import StageProgress

from cli_zygote import Zygote
from conftest import write_wds

WORKER = Path(__file__).with_name("encode_worker.py")
QUIET = StageProgress(enabled=False)


def params(tmp_path, datasets, **kw):
    return EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=datasets, verbose=False,
                          output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"), **kw)


def session(amp=False):
    resolved = resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None))
    return ModelSession(resolved, torch.device("cpu"), amp, "amp_bf16" if amp else "fp32")


def test_rescore_never_loads_a_model_or_decodes_an_image(prefect_server, tmp_path, monkeypatch):
    first = evaluate(params(tmp_path, ["shapes", "shapes_retrieval"], limit=60))

    def forbidden(*args, **kwargs):
        raise AssertionError("rescore must not load a model or decode an image")

    monkeypatch.setattr("clipcache.tasks.encode.stage.load_model", forbidden)
    monkeypatch.setattr("clipcache.tasks.datasets.base.EvalDataset.load_image", forbidden)
    again = rescore(params(tmp_path, ["shapes", "shapes_retrieval"], limit=60))
    assert [r.metrics for r in again] == [r.metrics for r in first]
    assert all(r.cache_hit and not r.model_loaded for r in again)
    more = rescore(params(tmp_path, ["shapes_retrieval"], limit=60, recall_k=[2, 50],
                          retrieval_metrics=["recall", "mrr", "ndcg", "rank"]))[0].metrics
    assert more["image_retrieval_recall@50"] == 1.0 and "text_retrieval_ndcg@2" in more
    assert 1.0 <= more["image_retrieval_median_rank"] <= more["image_retrieval_mean_rank"] + 60


def test_rescore_names_what_is_missing_and_the_command_that_fills_it(prefect_server, tmp_path):
    with pytest.raises(ClipcacheError) as err:
        rescore(params(tmp_path, ["shapes_retrieval"], limit=7))
    message = str(err.value)
    assert "image embeddings of shapes_retrieval" in message and "caption embeddings" in message
    assert f"clipcache eval --model tiny-shapes-clip --dataset shapes_retrieval --limit 7 --cache_dir " \
           f"{tmp_path / 'cache'}" in message


def test_prompts_are_encoded_once_per_text_across_datasets_and_template_sets(tmp_path):
    store, s = EmbeddingStore(tmp_path), session()
    old = [f"a photo of a {c}." for c in CLASSNAMES]
    first = encode_prompts(s, old, store, 64, QUIET, "a")
    assert first.encoded == 30 and s.loads == 1
    again = encode_prompts(s, list(old), store, 64, QUIET, "b")  # another dataset, same class names
    assert again.encoded == 0
    new = old + [f"a sketch of a {c}." for c in CLASSNAMES]
    grown = encode_prompts(s, new, store, 64, QUIET, "c")
    assert grown.encoded == 30  # only the new template's prompts
    pool = TextPool(store, grown.pool)
    np.testing.assert_array_equal(pool.gather(grown.lookup)[:30], pool.gather(first.lookup))
    other_precision = encode_prompts(session(amp=True), old, store, 64, QUIET, "d")
    assert other_precision.pool != first.pool and other_precision.encoded == 30


def test_shared_class_names_across_datasets_encode_no_new_prompts(prefect_server, tmp_path):
    a = write_wds(tmp_path / "a", "classification", 12, shards=1)
    b = write_wds(tmp_path / "b", "classification", 15, shards=1, seed=1)
    evaluate(params(tmp_path, ["wds/a"], dataset_root=str(a)))
    store = EmbeddingStore(tmp_path / "cache")
    batches_before = list((store.root / "pools").rglob("*"))
    result = evaluate(params(tmp_path, ["wds/b"], dataset_root=str(b)))[0]
    assert list((store.root / "pools").rglob("*")) == batches_before  # no new prompt batch
    assert not result.cache_hit  # its images were new


def test_every_key_field_changes_the_image_key(tmp_path, tiny_model_dir):
    import shutil

    memo = FileHashMemo(None)
    base_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir, base_dir)

    def key(model_dir=base_dir, precision="fp32", dataset=None, split="test", limit=None):
        resolved = resolve_model(ModelSpec(model_name=f"local-dir:{model_dir}"), memo)
        s = ModelSession(resolved, torch.device("cpu"), precision != "fp32", precision)
        return entry_key(image_key_fields(s, dataset or {"content": "x"}, split, limit))

    base = key()
    variants = {"precision": key(precision="amp_bf16"), "dataset": key(dataset={"content": "y"}),
                "split": key(split="train"), "limit": key(limit=10)}
    config = json.loads((base_dir / "open_clip_config.json").read_text())
    for name, change in [("preprocess mean", lambda c: c["preprocess_cfg"].update(mean=[0.5, 0.5, 0.5])),
                         ("image size", lambda c: c["model_cfg"]["vision_cfg"].update(image_size=32)),
                         ("context length", lambda c: c["model_cfg"]["text_cfg"].update(context_length=16))]:
        other = tmp_path / name.replace(" ", "_")
        shutil.copytree(base_dir, other)
        changed = json.loads(json.dumps(config))
        change(changed)
        (other / "open_clip_config.json").write_text(json.dumps(changed))
        variants[name] = key(model_dir=other)
    weights = tmp_path / "weights"
    shutil.copytree(base_dir, weights)
    data = bytearray((weights / "open_clip_model.safetensors").read_bytes())
    data[-1] ^= 1
    (weights / "open_clip_model.safetensors").write_bytes(bytes(data))
    variants["weights"] = key(model_dir=weights)
    assert base not in variants.values() and len(set(variants.values())) == len(variants)
    # the role is part of the key too: captions of the same dataset never collide with images
    s = ModelSession(resolve_model(ModelSpec(model_name=f"local-dir:{base_dir}"), memo), torch.device("cpu"), False,
                     "fp32")
    from clipcache.tasks.encode.stage import caption_key_fields

    assert entry_key(caption_key_fields(s, {"content": "x"}, "test", None)) != base


CHUNK_ROWS = 512  # the workers' chunk setting: small, so a kill lands after a committed chunk within seconds
N, BATCH = 2_000, 48  # 48 does not divide the 512-row chunk: resumption must realign batches


@pytest.fixture(scope="module")
def zygote():
    """The workers are forked from a process that imported torch and open_clip once (tests/cli_zygote.py): each is
    still a process of its own that a SIGKILL ends, without ~5 s of imports per start."""
    z = Zygote()
    yield z
    z.close()


def run_worker(zygote, cache, n, batch_size, env=None):
    env = {**os.environ, "CLIPCACHE_CHUNK_ROWS": str(CHUNK_ROWS), **(env or {})}
    return zygote.start([str(cache), str(n), str(batch_size)], Path.cwd(), env, script=WORKER)


@pytest.fixture(scope="module")
def uninterrupted(zygote, tmp_path_factory):
    """N shapes encoded in one go (512-row chunks): the entry both kill tests must equal bit for bit."""
    cache = tmp_path_factory.mktemp("uninterrupted") / "cache"
    out, err = run_worker(zygote, cache, N, BATCH).communicate(timeout=300)
    assert out, err[-2000:]
    key = out.split()[0]
    return key, EmbeddingStore(cache).open(key)


@pytest.mark.slow
def test_sigkill_mid_encode_resumes_from_the_last_chunk_bit_identical(zygote, uninterrupted, tmp_path):
    cache = tmp_path / "killed"
    proc = run_worker(zygote, cache, N, BATCH)
    progress_files = lambda: list((cache / "embeddings").glob("*.partial.zarr/progress.json"))  # noqa: E731
    deadline = time.monotonic() + 240
    committed = 0
    while time.monotonic() < deadline and proc.poll() is None:
        for f in progress_files():
            try:
                committed = json.loads(f.read_text())["rows"]
            except (OSError, ValueError):
                pass
        if committed >= CHUNK_ROWS:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(300)
    assert proc.returncode == -signal.SIGKILL, "the encode finished before it could be killed"
    store = EmbeddingStore(cache)
    assert store.keys() == [] and store.partial_keys()  # the half-written entry is not readable as complete
    committed_seals = json.loads(progress_files()[0].read_text())["seals"]
    assert {"embeddings", "norms", "position"} <= set(committed_seals)  # the norms commit with their rows
    key, was_resumed, encoded = run_worker(zygote, cache, N, BATCH).communicate(timeout=300)[0].split()
    assert was_resumed == "True" and int(encoded) <= N - CHUNK_ROWS
    clean_key, uninterrupted_entry = uninterrupted
    assert clean_key == key
    entry = store.open(key)
    # every array, the rows' norms and positions too, and every chunk's seal: bit-identical to the uninterrupted run
    assert {"embeddings", "norms", "position"} <= set(entry.array_names()) == set(uninterrupted_entry.array_names())
    for name in entry.array_names():
        np.testing.assert_array_equal(entry.array(name), uninterrupted_entry.array(name))
    assert entry.attrs["chunk_seals"] == uninterrupted_entry.attrs["chunk_seals"]


@pytest.mark.slow
def test_a_kill_loses_at_most_commit_seconds_of_work_even_inside_one_chunk(zygote, uninterrupted, tmp_path):
    """Rows commit by time as well as by chunk: with 4,096-row chunks, 2,000 rows never fill one, yet a kill after
    a second of encoding keeps what was committed, and the resumed entry is bit-identical with full-size chunks
    (its rows equal the uninterrupted run's, which was written in 512-row chunks)."""
    env = {"CLIPCACHE_CHUNK_ROWS": "4096", "CLIPCACHE_COMMIT_SECONDS": "1"}
    cache = tmp_path / "killed"
    proc = run_worker(zygote, cache, N, BATCH, env=env)
    deadline, committed = time.monotonic() + 240, 0
    while time.monotonic() < deadline and proc.poll() is None:
        for f in (cache / "embeddings").glob("*.partial.zarr/progress.json") if (cache / "embeddings").exists() else []:
            try:
                committed = json.loads(f.read_text())["rows"]
            except (OSError, ValueError):
                pass
        if committed:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(300)
    assert proc.returncode == -signal.SIGKILL and 0 < committed < 4096, (proc.returncode, committed)
    key, was_resumed, encoded = run_worker(zygote, cache, N, BATCH, env=env).communicate(timeout=300)[0].split()
    assert was_resumed == "True" and int(encoded) <= N - committed
    clean_key, clean = uninterrupted
    assert clean_key == key
    resumed = EmbeddingStore(cache).open(key)
    np.testing.assert_array_equal(resumed.embeddings(), clean.embeddings())
    assert resumed._group["embeddings"].chunks[0] == min(4096, N)  # reads still go by whole chunks, not commits
    assert EmbeddingStore(cache).verify(key) == []


@pytest.mark.slow
def test_two_processes_encoding_the_same_key(zygote, tmp_path):
    cache = tmp_path / "shared"
    procs = [run_worker(zygote, cache, N, 64) for _ in range(2)]  # forked at once: both start encoding together
    outs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0][0] == outs[1][0]
    assert sorted(int(o[2]) for o in outs) == [0, N]  # one encoded, the other waited and reused it
    store = EmbeddingStore(cache)
    assert store.keys() == [outs[0][0]] and not store.partial_keys()
    assert store.verify(outs[0][0]) == []


def test_damaged_chunk_is_found_by_reads_and_verify_and_re_encoded_on_request(prefect_server, tmp_path, capsys):
    p = params(tmp_path, ["shapes"], limit=40)
    first = evaluate(p)[0]
    store = EmbeddingStore(tmp_path / "cache")
    image_key = next(k for k in store.keys() if store.open(k).attrs["kind"] == "image")
    chunk = next(f for f in (store.entry_path(image_key) / "embeddings").rglob("*") if f.is_file()
                 and f.name != "zarr.json")
    raw = bytearray(chunk.read_bytes())
    raw[100] ^= 0xFF  # flip bits on disk, behind zarr's back
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CacheIntegrityError, match=f"{image_key}.*embeddings/c/0/0"):
        store.open(image_key).embeddings()
    assert main(["cache", "--cache_dir", str(store.root), "verify"]) == 1
    assert f"damaged {image_key}" in capsys.readouterr().out
    assert main(["cache", "--cache_dir", str(store.root), "verify", "--delete"]) == 1
    assert not store.has(image_key)
    again = evaluate(p)[0]
    assert again.metrics == first.metrics and not again.cache_hit


def test_cache_ls_info_gc(prefect_server, tmp_path, capsys):
    evaluate(params(tmp_path, ["shapes", "shapes_retrieval"], limit=20))
    root = str(tmp_path / "cache")
    assert main(["cache", "--cache_dir", root, "ls", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    kinds = sorted(r["kind"] for r in rows)
    assert kinds == ["caption", "image", "image", "prompt"]
    assert all(r["model"] == "tiny-shapes-clip" and r["bytes"] > 0 and r["dim"] == 64 for r in rows)
    image = next(r for r in rows if r["dataset"] == "shapes" and r["kind"] == "image")
    # which tasks read which entry: each task declares the roles and the kinds of data it reads
    served = {(r["dataset"], r["kind"]): r["tasks"] for r in rows}
    assert served[("shapes", "image")] == ["face_attributes", "image_clustering", "knn_classification",
                                           "linear_probe", "mieb_linear_probe", "multilabel_probe",
                                           "zeroshot_classification"]
    # captioning reads a retrieval set's images for CLIPScore (its captions and references are texts of its own)
    assert served[("shapes_retrieval", "image")] == ["captioning", "zeroshot_retrieval"]
    assert served[("shapes_retrieval", "caption")] == ["zeroshot_retrieval"]
    # the prompt pool: class prompts, FairFace's heads' prompts and the texts mteb's tasks encode share it
    assert [r["tasks"] for r in rows if r["kind"] == "prompt"] == [["face_attributes", "mieb",
                                                                    "zeroshot_classification"]]
    assert main(["cache", "--cache_dir", root, "ls", "--json", "--task", "linear_probe"]) == 0
    assert [json.loads(line)["key"] for line in capsys.readouterr().out.strip().splitlines()] == [image["key"]]
    assert main(["cache", "--cache_dir", root, "ls"]) == 0
    assert "serves" in capsys.readouterr().out
    assert main(["cache", "--cache_dir", root, "ls", "--task", "linear_prob"]) == 2
    assert "Did you mean" in capsys.readouterr().err
    assert main(["cache", "--cache_dir", root, "info", image["key"][:10]]) == 0
    assert '"count": 20' in capsys.readouterr().out
    assert main(["cache", "--cache_dir", root, "gc", "--pattern", "shapes_retrieval", "--dry_run"]) == 0
    assert "would free" in capsys.readouterr().out and len(EmbeddingStore(root).keys()) == 4
    assert main(["cache", "--cache_dir", root, "gc", "--pattern", "shapes_retrieval"]) == 0
    assert len(EmbeddingStore(root).keys()) == 2
    assert main(["cache", "--cache_dir", root, "gc", "--max_size", "0B"]) == 0
    assert EmbeddingStore(root).keys() == []
    assert main(["cache", "--cache_dir", root, "gc", "--older_than", "soon"]) == 2


def test_rescore_with_a_new_template_set_encodes_only_new_prompts(prefect_server, tmp_path, monkeypatch):
    root = write_wds(tmp_path / "d", "classification", 30, shards=1)
    evaluate(params(tmp_path, ["wds/d"], dataset_root=str(root)))
    templates = tmp_path / "templates.json"
    templates.write_text(json.dumps(["a photo of a {c}.", "a tiny {c}, seen from above."]))

    def no_decoding(*args, **kwargs):
        raise AssertionError("rescore must not decode an image")

    monkeypatch.setattr("clipcache.tasks.datasets.base.EvalDataset.load_image", no_decoding)
    store = EmbeddingStore(tmp_path / "cache")
    before = set(store.keys())
    again = rescore(params(tmp_path, ["wds/d"], dataset_root=str(root), templates=str(templates)))[0]
    added = [store.open(k) for k in set(store.keys()) - before]
    assert [e.attrs["kind"] for e in added] == ["prompt"] and added[0].count == 30  # only "a tiny {c}..." x 30
    assert again.model_loaded and not again.cache_hit
    from clipcache.storage.warehouse import connect

    keys = connect(tmp_path / "out").sql("select distinct unnest(cache_keys) from metrics where run_id in "
                                         "(select run_id from metrics order by created_at desc limit 1)").fetchall()
    assert (added[0].key,) in keys and len(keys) == 3  # images + the old and the new prompt batch
    # Editing the dataset's own templates file is the same thing: the image embeddings stay valid.
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\na tiny {c}, seen from above.\n")
    assert rescore(params(tmp_path, ["wds/d"], dataset_root=str(root)))[0].metrics == again.metrics


def test_bad_template_and_classname_files_are_named(prefect_server, tmp_path, capsys):
    bad = tmp_path / "t.txt"
    bad.write_text("a photo of a thing\n")
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "5", "--templates", str(bad),
                 "--output_dir", str(tmp_path / "o"), "--cache_dir", str(tmp_path / "c"), "--quiet"])
    assert code == 2 and "has a template without {c}" in capsys.readouterr().err
    names = tmp_path / "n.json"
    names.write_text(json.dumps(["only", "three", "names"]))
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "5", "--classnames",
                 str(names), "--output_dir", str(tmp_path / "o"), "--cache_dir", str(tmp_path / "c"), "--quiet"])
    assert code == 2 and "has 3 names, the dataset has 30 classes" in capsys.readouterr().err
