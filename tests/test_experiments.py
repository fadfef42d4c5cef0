"""Every experiment is its own row: checkpoints, limits, what-ifs and languages never overwrite one another, and the
leaderboard shows only complete reference runs (issue: results you can trust)."""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest
import zarr

from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.warehouse import connect

from conftest import TINY_MODEL

ARCH = "TinyShapes-Arch"


@pytest.fixture
def checkpoints(tmp_path):
    """One architecture (an --arch_config file) and two checkpoint files both named epoch_32.safetensors."""
    from safetensors.torch import load_file, save_file

    config = json.loads((TINY_MODEL / "open_clip_config.json").read_text())["model_cfg"]
    arch = tmp_path / f"{ARCH}.json"
    arch.write_text(json.dumps(config))
    import torch

    weights = load_file(TINY_MODEL / "open_clip_model.safetensors")
    noise = torch.randn(weights["visual.proj"].shape, generator=torch.Generator().manual_seed(0))
    paths = []
    for i, run in enumerate(("run_a", "run_b")):
        (tmp_path / run).mkdir()
        changed = {k: (v + i * noise.to(v.dtype) if k == "visual.proj" else v) for k, v in weights.items()}
        save_file(changed, tmp_path / run / "epoch_32.safetensors")
        paths.append(tmp_path / run / "epoch_32.safetensors")
    return arch, paths


def run_cli(capsys, *argv, out, cache):
    code = main([*argv, "--output_dir", str(out), "--cache_dir", str(cache), "--quiet"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def result_files(out):
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.json"))


def test_two_checkpoints_of_one_architecture_live_side_by_side(checkpoints, wds_classification, tmp_path, capsys):
    arch, (a, b) = checkpoints
    out, cache = tmp_path / "out", tmp_path / "cache"
    base = ["eval", "--model", ARCH, "--arch_config", str(arch), "--dataset", "wds/shapes_cls",
            "--dataset_root", str(wds_classification)]
    code, stdout, err = run_cli(capsys, *base, "--pretrained", str(a), str(b), out=out, cache=cache)
    assert code == 0, err
    files = result_files(out)
    assert len(files) == 2 and all(f.startswith(f"{ARCH}/epoch_32.safetensors@") for f in files)
    con = connect(out)
    board = con.sql("select pretrained, value from leaderboard where metric = 'acc' and k = 1 "
                    "order by pretrained").fetchall()
    assert len(board) == 2 and board[0][0] != board[1][0] and board[0][1] != board[1][1]
    assert con.sql("select count(distinct experiment_id), count(distinct checkpoint) from metrics").fetchall() == \
        [(2, 2)]

    # a moved checkpoint is the same checkpoint: --skip_existing skips it; a third one is evaluated
    moved = tmp_path / "elsewhere" / "epoch_32.safetensors"
    moved.parent.mkdir()
    shutil.move(a, moved)
    c = tmp_path / "run_c" / "epoch_32.safetensors"
    c.parent.mkdir()
    shutil.copy(b, c)
    c.write_bytes(c.read_bytes()[:-8] + b"\x00" * 8)  # other bytes: another checkpoint
    code, stdout, err = run_cli(capsys, *base, "--pretrained", str(moved), str(b), str(c), "--skip_existing",
                                out=out, cache=cache)
    assert code == 0, err
    assert stdout.count("skipped") == 2 and stdout.count("encoded") == 1
    assert len(result_files(out)) == 3
    # --pretrained_model pairs, as clip_benchmark takes them
    code, stdout, err = run_cli(capsys, "eval", "--pretrained_model", f"{ARCH},{moved}", "--arch_config", str(arch),
                                "--dataset", "wds/shapes_cls", "--dataset_root", str(wds_classification),
                                "--skip_existing", out=out, cache=cache)
    assert code == 0 and "skipped" in stdout, err


def test_limited_runs_and_what_ifs_never_become_the_leaderboard_value(wds_classification, tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/shapes_cls", "--dataset_root", str(wds_classification)]
    assert run_cli(capsys, "eval", *base, out=out, cache=cache)[0] == 0
    reference = json.loads((out / "tiny-shapes-clip" / "wds_shapes_cls_zeroshot_classification.json").read_text())
    assert run_cli(capsys, "eval", *base, "--limit", "30", out=out, cache=cache)[0] == 0
    templates = tmp_path / "t.txt"
    templates.write_text("a blurry photo of a {c}.\n")
    code, _, err = run_cli(capsys, "rescore", *base, "--templates", str(templates), out=out, cache=cache)
    assert code == 0, err
    files = result_files(out)
    assert len(files) == 3 and any(".limit30." in f for f in files) and any(".prompts-" in f for f in files)
    # the reference result file was not overwritten
    assert json.loads((out / "tiny-shapes-clip" / "wds_shapes_cls_zeroshot_classification.json").read_text()) == \
        reference
    con = connect(out)
    assert con.sql("select count(distinct experiment_id) from metrics").fetchall() == [(3,)]
    value = con.sql("select value from leaderboard where metric = 'acc' and k = 1").fetchall()
    assert value == [(pytest.approx(reference["metrics"]["acc1"]),)]
    what_if = con.sql("select sample_limit, default_prompts, prompts_sha256 is not null from metrics "
                      "where metric = 'acc' and k = 1 order by created_at").fetchall()
    assert what_if == [(None, True, True), (30, True, True), (None, False, True)]
    # the leaderboard's columns
    columns = con.sql("select * from leaderboard").columns
    assert {"model", "pretrained", "dataset", "split", "language", "task", "metric", "k", "value", "run_id",
            "created_at"} <= set(columns)
    assert main(["query", "select model, value from leaderboard where k = 1", "--output_dir", str(out)]) == 0
    assert "tiny-shapes-clip" in capsys.readouterr().out


def test_labels_and_caption_maps_are_sealed_like_the_embeddings(wds_classification, tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    base = ["--model", "tiny-shapes-clip", "--dataset", "wds/shapes_cls", "shapes_retrieval", "--limit", "40",
            "--dataset_root", str(wds_classification)]
    assert run_cli(capsys, "eval", *base, out=out, cache=cache)[0] == 0
    store = EmbeddingStore(cache)
    image = next(k for k in store.keys() if "target" in store.open(k).array_names())
    target = zarr.open_array(str(store.entry_path(image) / "target"), mode="r+")
    labels = np.asarray(target[...])
    target[0] = (labels[0] + 1) % 30  # through zarr itself: the chunk file is valid, only its content changed
    assert main(["cache", "--cache_dir", str(cache), "verify"]) == 1
    report = capsys.readouterr().out
    assert f"damaged {image}" in report and "target/c/0" in report
    code, _, err = run_cli(capsys, "rescore", *base, out=out, cache=cache)
    assert code != 0 and f"cache entry {image} is damaged" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    caption = next(k for k in store.keys() if store.open(k).kind == "caption")
    sample_map = zarr.open_array(str(store.entry_path(caption) / "caption_sample"), mode="r+")
    sample_map[0] = int(sample_map[-1]) + 1
    assert any("caption_sample" in p for p in store.verify(caption))


def test_result_files_follow_the_umask(tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    previous = os.umask(0o022)
    try:
        assert run_cli(capsys, "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "10",
                       out=out, cache=cache)[0] == 0
    finally:
        os.umask(previous)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in written)


@pytest.mark.parametrize("argv,message", [
    (["--dataset", "shapes_retrieval", "--language", "cn"],
     "language: 'cn' is not available for dataset 'shapes_retrieval' (available: en)"),
    (["--dataset", "shapes", "--language", "cn"], "language: 'cn' is not available for dataset 'shapes'"),
    (["--model", ARCH, "--pretrained", "/nowhere/epoch_32.pt", "--dataset", "shapes"],
     "pretrained: checkpoint file /nowhere/epoch_32.pt does not exist"),
])
def test_identity_errors_are_one_line(checkpoints, tmp_path, capsys, argv, message):
    arch, _ = checkpoints
    model = [] if "--model" in argv else ["--model", "tiny-shapes-clip"]
    code, _, err = run_cli(capsys, "eval", *model, *argv, "--arch_config", str(arch), out=tmp_path / "o",
                           cache=tmp_path / "c")
    assert code != 0 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "warehouse" / "metrics").exists()


def test_a_warehouse_of_release_0_1_migrates_with_nothing_lost(tmp_path, capsys):
    from clipcache.storage.compaction import table_checksum
    from clipcache.storage.results import V1_COLUMNS

    from conftest import REPO

    out = tmp_path / "outputs"
    shutil.copytree(REPO / "tests" / "fixtures" / "warehouse_release_0_1", out)
    before = {t: table_checksum(out, t, V1_COLUMNS[t]) for t in ("metrics", "runs")}
    # read as it is: every row is there; what makes it a reference is unknown until it is migrated
    assert connect(out).sql("select count(*) from metrics_all").fetchall() == [(before["metrics"][0],)]
    assert main(["report", "--output_dir", str(out)]) == 1
    assert "results migrate" in capsys.readouterr().err
    assert main(["results", "migrate", "--output_dir", str(out)]) == 0
    after = {t: table_checksum(out, t, V1_COLUMNS[t]) for t in ("metrics", "runs")}
    assert after == before
    con = connect(out)
    runs = dict(con.sql("select status, count(*) from runs group by all").fetchall())
    assert runs == {"completed": 4, "failed": 1}
    experiments = con.sql("select task, sample_limit, default_prompts, count(distinct run_id) from metrics "
                          "group by all order by all").fetchall()
    assert experiments == [("text_retrieval", None, True, 1), ("zeroshot_classification", 100, True, 1),
                           ("zeroshot_classification", None, False, 1), ("zeroshot_classification", None, True, 1),
                           ("zeroshot_retrieval", None, True, 1)]
    board = con.sql("select dataset, count(distinct run_id) from leaderboard group by all order by all").fetchall()
    assert board == [("mybeir", 1), ("shapes", 1), ("shapes_retrieval", 1)]
    # the bundled model still resolves to the fingerprint the rows recorded: its rows got its checkpoint identity
    assert con.sql("select distinct checkpoint like 'sha256:%' from metrics where model = 'tiny-shapes-clip'"
                   ).fetchall() == [(True,)]
    assert main(["report", "--output_dir", str(out)]) == 0
