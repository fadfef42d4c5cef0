"""The three entry points (CLI, evalscope task config, Prefect flow) and every bad input of the core issue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from clipcache.flows.cli import main
from clipcache.storage.errors import ConfigError
from clipcache.storage.naming import path_component

from conftest import REPO, replace_tar_member, write_image_queries, write_wds


@pytest.fixture
def dirs(tmp_path):
    return {"out": tmp_path / "out", "cache": tmp_path / "cache"}


def cli(capsys, *argv, dirs=None):
    extra = ["--output_dir", str(dirs["out"]), "--cache_dir", str(dirs["cache"]), "--quiet"] if dirs else []
    code = main([*argv, *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eval_writes_every_output_and_second_run_is_a_cache_hit(prefect_server, capsys, dirs):
    template = str(dirs["out"] / "cb_{dataset}_{model}_{task}_{language}.json")
    args = ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "shapes_retrieval", "--limit", "90",
            "--recall_k", "1", "5", "--output", template]
    code, out, err = cli(capsys, *args, dirs=dirs)
    assert code == 0, err
    assert "encoded" in out and "acc1" in out
    # --limit makes its own experiment: a result file of its own, never the full run's
    cls = json.loads((dirs["out"] / "tiny-shapes-clip" / "shapes_zeroshot_classification.limit90.json").read_text())
    assert cls["dataset"] == "shapes" and cls["model"] == "tiny-shapes-clip"
    assert cls["task"] == "zeroshot_classification"
    assert set(cls["metrics"]) == {"acc1", "acc5", "mean_per_class_recall"}
    assert cls["metrics"]["acc1"] > 0.5  # 30 classes: chance is 0.033
    ret = json.loads((dirs["out"] / "tiny-shapes-clip" /
                      "shapes_retrieval_zeroshot_retrieval.limit90.json").read_text())
    assert set(ret["metrics"]) == {f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5)}
    cb = json.loads((dirs["out"] / "cb_shapes_tiny-shapes-clip_zeroshot_classification_en.json").read_text())
    assert set(cb) == {"dataset", "model", "pretrained", "task", "metrics", "language"}
    rows = pq.read_table(dirs["out"] / "warehouse" / "metrics").to_pylist()
    assert len(rows) == 3 + 4
    acc5 = next(r for r in rows if r["metric"] == "acc" and r["k"] == 5)
    assert acc5["n_samples"] == 90 and acc5["higher_is_better"] and acc5["schema_version"] == 2
    assert acc5["sample_limit"] == 90 and acc5["experiment_id"] == cls["experiment_id"] and acc5["default_prompts"]
    assert acc5["created_at"].tzinfo is not None and len(acc5["cache_keys"]) == 2
    runs = pq.read_table(dirs["out"] / "warehouse" / "runs").to_pylist()
    assert runs[0]["status"] == "completed"

    code, out, _ = cli(capsys, *args, dirs=dirs)
    assert code == 0 and out.count("cache hit") == 2 and "encoded" not in out
    again = json.loads((dirs["out"] / "tiny-shapes-clip" /
                        "shapes_zeroshot_classification.limit90.json").read_text())
    assert again == cls


def test_flow_reports_zero_model_loads_on_a_warm_cache(prefect_server, dirs):
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    params = EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=["shapes"], limit=30,
                            output_dir=str(dirs["out"]), cache_dir=str(dirs["cache"]), verbose=False)
    first = evaluate(params)
    second = evaluate(params)
    assert first[0].model_loaded and not first[0].cache_hit
    assert second[0].cache_hit and not second[0].model_loaded
    assert second[0].metrics == first[0].metrics


def test_run_task_with_evalscope_config_and_custom_dataset(prefect_server, tmp_path, tiny_model_dir):
    from clipcache import run_task

    data_dir = write_image_queries(tmp_path / "custom_eval", n=10)
    task_cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": f"local-dir:{tiny_model_dir}"}], "dataset_name": ["custom"],
        "data_dir": str(data_dir), "split": "test", "batch_size": 4, "num_workers": 1, "verbose": False,
        "skip_existing": False, "output_dir": str(tmp_path / "outputs"), "cache_dir": str(tmp_path / "cache"),
        "limit": 8}}}
    results = run_task(task_cfg)
    assert results[0]["task"] == "zeroshot_retrieval"
    path = tmp_path / "outputs" / "tiny-shapes-clip" / "custom_zeroshot_retrieval.limit8.json"
    saved = json.loads(path.read_text())
    assert {k: saved[k] for k in ("dataset", "model", "task", "metrics")} == {
        "dataset": "custom", "model": f"local-dir:{tiny_model_dir}", "task": "zeroshot_retrieval",
        "metrics": results[0]["metrics"]}
    # the same config as a YAML file through `clipcache run`; skip_existing now skips the finished pair
    task_cfg["eval_config"]["eval"]["skip_existing"] = True
    cfg_file = tmp_path / "task_cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(task_cfg))
    assert main(["run", str(cfg_file)]) == 0
    assert json.loads(path.read_text()) == saved


def test_skip_existing_is_per_pair(prefect_server, capsys, dirs):
    base = ["eval", "--model", "tiny-shapes-clip", "--limit", "20", "--skip_existing"]
    assert cli(capsys, *base, "--dataset", "shapes", dirs=dirs)[0] == 0
    code, out, _ = cli(capsys, *base, "--dataset", "shapes", "shapes_retrieval", dirs=dirs)
    assert code == 0 and "skipped" in out and "encoded" in out  # the loop goes on after a skip


def test_unknown_config_keys_are_named():
    from clipcache import run_task

    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "tiny-shapes-clip", "modle_type": "hf"}], "dataset_name": ["shapes"],
        "batchsize": 3}}}
    with pytest.raises(ConfigError) as err:
        run_task(cfg)
    assert "eval_config.eval.batchsize: unknown key" in str(err.value)
    assert "eval_config.eval.models.0.modle_type: unknown key" in str(err.value)
    cfg["eval_config"]["eval"] = {"models": [{"model_name": "m"}], "dataset_name": ["shapes"], "task": "classify"}
    with pytest.raises(ConfigError, match="eval_config.eval.task"):
        run_task(cfg)


@pytest.fixture(scope="module")
def broken_wds(tmp_path_factory):
    root = write_wds(tmp_path_factory.mktemp("broken") / "d", "classification", 12, shards=1, fmt="png")
    replace_tar_member(root / "test" / "0.tar", "s000004.png", b"\x89PNG garbage")
    return root


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "shapez"], "Unknown dataset 'shapez'. Did you mean: shapes"),
    (["--dataset", "wds/missing", "--dataset_root", "/nonexistent/{dataset}"], "does not exist"),
    (["--dataset", "shapes", "--task", "zeroshot_retrieval"], "does not fit dataset 'shapes'"),
    (["--dataset", "shapes_retrieval", "--task", "zeroshot_classification"], "retrieval dataset"),
    (["--dataset", "shapes", "--language", "cn"], "language: 'cn' is not available"),
    (["--dataset", "shapes", "--recall_k", "0"], "recall_k.0: Input should be greater than 0"),
    (["--dataset", "custom", "--dataset_root", "/nonexistent"], "image_queries.jsonl not found"),
])
def test_bad_input_is_one_clear_line(prefect_server, capsys, dirs, argv, message):
    code, out, err = cli(capsys, "eval", "--model", "tiny-shapes-clip", *argv, dirs=dirs)
    assert code != 0 and message in err and "Traceback" not in err + out


def test_unknown_model_and_flag_values(capsys, dirs):
    code, _, err = cli(capsys, "eval", "--model", "ViT-B-3", "--dataset", "shapes", dirs=dirs)
    assert code != 0 and "Did you mean: ViT-B-32" in err
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--model", "m", "--dataset", "shapes", "--task", "classify"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--task: 'classify' is not one of auto," in err and len(err.strip().splitlines()) == 1  # no usage dump
    with pytest.raises(SystemExit):
        main(["eval", "--model", "m", "--dataset", "shapes", "--task", "zeroshot_clasification"])
    assert "Did you mean zeroshot_classification?" in capsys.readouterr().err


def test_missing_split_and_nshards(prefect_server, capsys, dirs, wds_classification):
    code, _, err = cli(capsys, "eval", "--model", "tiny-shapes-clip", "--dataset", "wds/shapes_cls",
                       "--dataset_root", str(wds_classification), "--split", "valid", dirs=dirs)
    assert code != 0 and "available splits: test" in err


def test_corrupt_image_fails_naming_it_or_is_skipped_and_counted(prefect_server, capsys, dirs, broken_wds):
    base = ["eval", "--model", "tiny-shapes-clip", "--dataset", "wds/d", "--dataset_root", str(broken_wds)]
    code, out, err = cli(capsys, *base, dirs=dirs)
    assert code != 0 and "0.tar member s000004.png" in err and "--on_bad_image skip" in err
    assert "Traceback" not in err + out
    assert not list((dirs["out"]).glob("*/*.json"))  # nothing half-written
    code, out, err = cli(capsys, *base, "--on_bad_image", "skip", dirs=dirs)
    assert code == 0, err
    saved = json.loads((dirs["out"] / "tiny-shapes-clip" / f"{path_component('wds/d')}_zeroshot_classification.json").read_text())
    assert saved["metrics"]["skipped_images"] == 1


@pytest.mark.slow
def test_real_console_script_errors_without_traceback(tmp_path, broken_wds):
    """The installed `clipcache` command, in a fresh process with the ephemeral Prefect engine."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_LOGGING_LEVEL", None)
    exe = Path(sys.executable).with_name("clipcache")
    proc = subprocess.run([str(exe), "eval", "--model", "tiny-shapes-clip", "--dataset", "wds/d", "--dataset_root",
                           str(broken_wds), "--output_dir", str(tmp_path / "o"), "--cache_dir", str(tmp_path / "c")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 1
    assert "s000004.png" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("argv", [["datasets"], ["--version"]])  # a rich table; plain print()
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path, argv):
    """`clipcache datasets | head -1`: the read end is closed before the command writes a byte, so its first write
    fails with EPIPE; it ends with status 1 and nothing on stderr, not a BrokenPipeError traceback."""
    exe = Path(sys.executable).with_name("clipcache")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.Popen([str(exe), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child has imported anything, so its first write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err
    assert err == ""
