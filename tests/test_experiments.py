"""Every experiment is its own row: checkpoints, limits, what-ifs and languages never overwrite one another, and the
leaderboard shows only complete reference runs (issue: results you can trust)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat

import numpy as np
import pytest
import zarr

from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.naming import path_component
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
    reference = json.loads((out / "tiny-shapes-clip" / f"{path_component('wds/shapes_cls')}_zeroshot_classification.json").read_text())
    assert run_cli(capsys, "eval", *base, "--limit", "30", out=out, cache=cache)[0] == 0
    templates = tmp_path / "t.txt"
    templates.write_text("a blurry photo of a {c}.\n")
    code, _, err = run_cli(capsys, "rescore", *base, "--templates", str(templates), out=out, cache=cache)
    assert code == 0, err
    files = result_files(out)
    assert len(files) == 3 and any(".limit30." in f for f in files) and any(".prompts-" in f for f in files)
    # the reference result file was not overwritten
    assert json.loads((out / "tiny-shapes-clip" / f"{path_component('wds/shapes_cls')}_zeroshot_classification.json").read_text()) == \
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


def test_atomic_writes_follow_the_umask_in_force_when_they_write(tmp_path):
    from clipcache.storage.atomic import atomic_write_text

    previous = os.umask(0o027)  # after the module was imported: the mode must not be fixed at import time
    try:
        atomic_write_text(tmp_path / "a.json", "{}\n")
        os.umask(0o022)
        atomic_write_text(tmp_path / "b.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temporary file left behind


def test_converted_beir_folders_follow_the_umask(tmp_path):
    from clipcache.tasks.convert.beir import write_beir

    folder = tmp_path / "captioner" / "shapes" / "retrieval_data"
    previous = os.umask(0o022)
    try:
        write_beir(folder, ["a red circle", None], [["red circle"], ["blue square"]], "test")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "qrels").stat().st_mode) == 0o755
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in folder.rglob("*") if p.is_file())


def _model_folder(path, noise_seed: int | None):
    """A copy of the bundled model at ``path``; ``noise_seed``: other weights (another checkpoint)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(TINY_MODEL, path)
    if noise_seed is not None:
        import torch

        weights = load_file(path / "open_clip_model.safetensors")
        noise = torch.randn(weights["visual.proj"].shape, generator=torch.Generator().manual_seed(noise_seed))
        weights["visual.proj"] = weights["visual.proj"] + noise
        save_file(weights, path / "open_clip_model.safetensors")
    return path


def test_two_model_folders_of_one_name_live_side_by_side(tmp_path, capsys):
    a = _model_folder(tmp_path / "run_a" / "checkpoint-1000", None)
    b = _model_folder(tmp_path / "run_b" / "checkpoint-1000", 0)
    out, cache = tmp_path / "out", tmp_path / "cache"
    code, _, err = run_cli(capsys, "eval", "--model", str(a), str(b), "--dataset", "shapes", "--limit", "20",
                           out=out, cache=cache)
    assert code == 0, err
    files = result_files(out)
    assert len(files) == 2 and all(f.startswith("checkpoint-1000/checkpoint-1000@") for f in files), files
    labels = connect(out).sql("select distinct pretrained from metrics order by 1").fetchall()
    assert len(labels) == 2 and all(label.startswith("checkpoint-1000@") for (label,) in labels)


def test_one_checkpoint_under_two_names_is_evaluated_once_per_run(checkpoints, tmp_path, capsys):
    arch, (a, _) = checkpoints
    latest = a.with_name("latest.safetensors")
    shutil.copy(a, latest)  # the same bytes under another name: the same experiment
    out, cache = tmp_path / "out", tmp_path / "cache"
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    flow_log = logging.getLogger("clipcache.flow")
    flow_log.addHandler(handler)
    try:
        code, stdout, err = run_cli(capsys, "eval", "--model", ARCH, "--arch_config", str(arch), "--pretrained",
                                    str(a), str(latest), "--dataset", "shapes", "--limit", "20", "--orchestrator",
                                    "local", out=out, cache=cache)
    finally:
        flow_log.removeHandler(handler)
    assert code == 0, err
    assert stdout.count("skipped") == 1
    assert any("skipped, same experiment as" in line and "epoch_32.safetensors" in line for line in lines), lines
    assert len(result_files(out)) == 1
    con = connect(out)
    assert con.sql("select count(distinct experiment_id), count(*) = count(distinct (metric, k)) from metrics"
                   ).fetchall() == [(1, True)]


def test_the_leaderboard_shows_whole_runs_not_metrics_left_from_older_ones(wds_retrieval, tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    base = ["eval", "--model", "tiny-shapes-clip", "--dataset", "wds/shapes_ret", "--dataset_root", str(wds_retrieval)]
    assert run_cli(capsys, *base, "--recall_k", "1", "5", "50", out=out, cache=cache)[0] == 0
    assert run_cli(capsys, *base, "--recall_k", "1", "5", out=out, cache=cache)[0] == 0
    con = connect(out)
    assert con.sql("select count(distinct run_id), count(distinct experiment_id) from metrics where k = 50"
                   ).fetchall() == [(1, 1)]
    latest = con.sql("select run_id from runs order by created_at desc limit 1").fetchall()
    assert con.sql("select distinct run_id from leaderboard").fetchall() == latest
    assert con.sql("select count(*) from leaderboard where k = 50").fetchall() == [(0,)]
    assert con.sql("select count(*) from leaderboard where k = 5").fetchall() == [(2,)]  # both directions


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
    # classification rows with the dataset's own prompts got their hash: a new run of the same experiment lines up
    query = ("select distinct run_id, experiment_id, prompts_sha256 from metrics where dataset = 'shapes' "
             "and sample_limit = 100")
    [(old_run, experiment_id, prompts)] = con.sql(query).fetchall()
    assert prompts is not None
    assert main(["report", "--output_dir", str(out)]) == 0
    assert run_cli(capsys, "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "100",
                   out=out, cache=tmp_path / "cache")[0] == 0
    new = connect(out).sql(f"{query} and run_id <> '{old_run}'").fetchall()
    assert [row[1:] for row in new] == [(experiment_id, prompts)]
