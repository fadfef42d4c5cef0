"""Model loaders and dataset readers from other packages (entry point groups ``clipcache.models`` and
``clipcache.datasets``): the example package in examples/clipcache-plugin-example end to end through the CLI, with
numbers checked against the model and data used directly, and broken plugins reported in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

from clipcache.flows.cli import main
from clipcache.storage.errors import DatasetError, ModelError

from conftest import REPO, TINY_MODEL, write_image_queries

EXAMPLE = REPO / "examples" / "clipcache-plugin-example"
# Japanese class names and templates for the 30 shapes classes (same order as the English ones).
COLOURS_JA = ["赤い", "緑の", "青い", "黄色い", "紫の", "オレンジ色の"]
SHAPES_JA = ["円", "正方形", "三角形", "ひし形", "十字"]
TEMPLATES_JA = ["{c}の写真。", "{c}の絵。", "{c}。", "無地の背景の{c}。"]


def _installed(group: str, name: str) -> None:
    found = {ep.name: ep for ep in entry_points(group=group)}
    assert name in found, (f"the example plugin package is not installed: run `make venv` or "
                           f"`.venv/bin/python -m pip install -e {EXAMPLE.relative_to(REPO)}`")


def run_cli(*argv: str, out: Path, cache: Path) -> None:
    code = main([*argv, "--output_dir", str(out), "--cache_dir", str(cache), "--quiet", "--orchestrator", "local"])
    assert code == 0


def result(out: Path, pattern: str) -> dict:
    [path] = sorted(out.rglob(pattern))
    return json.loads(path.read_text())


def test_example_package_registers_both_entry_points():
    _installed("clipcache.models", "glossary_clip")
    _installed("clipcache.datasets", "csv_captions")
    from clipcache.tasks.datasets import DATASETS, default_task
    from clipcache.tasks.models import LOADERS

    assert "clipcache-plugin-example" in LOADERS.origin("glossary_clip")
    assert "clipcache-plugin-example" in DATASETS.origin("csv_captions")
    assert default_task("csv_captions", None) == "zeroshot_retrieval"  # from the reader's class, before indexing


def _ja_prompt_files(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    names = folder / "classnames_ja.txt"
    names.write_text("\n".join(c + s for c in COLOURS_JA for s in SHAPES_JA) + "\n", encoding="utf-8")
    templates = folder / "templates_ja.txt"
    templates.write_text("\n".join(TEMPLATES_JA) + "\n", encoding="utf-8")
    return names, templates


def _direct_accuracy(texts_for_class: list[list[str]], n: int) -> tuple[float, float]:
    """acc1 and mean per-class recall of the bundled model used directly with open_clip (clip_benchmark's
    classifier: normalised template embeddings averaged and normalised again)."""
    import open_clip
    import torch
    import torch.nn.functional as F

    from clipcache.tasks.datasets.shapes import load_shapes

    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{TINY_MODEL}", device="cpu")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{TINY_MODEL}")
    model.eval()
    ds = load_shapes("shapes", "zeroshot_classification", "test", n)
    with torch.inference_mode():
        images = F.normalize(model.encode_image(torch.stack([transform(ds.load_image(i)) for i in range(n)])), dim=-1)
        classifier = torch.stack([F.normalize(F.normalize(model.encode_text(tokenizer(texts)), dim=-1).mean(0), dim=0)
                                  for texts in texts_for_class])
    predicted = (images @ classifier.T).argmax(1).numpy()
    labels = np.asarray(ds.labels)
    recalls = [float((predicted[labels == c] == c).mean()) for c in np.unique(labels)]
    return float((predicted == labels).mean()), float(np.mean(recalls))


def test_glossary_loader_by_model_type_gives_the_numbers_of_the_model_used_directly(tmp_path):
    _installed("clipcache.models", "glossary_clip")
    from clipcache_plugin_example.loader import translate

    names, templates = _ja_prompt_files(tmp_path / "prompts")
    out, cache, n = tmp_path / "out", tmp_path / "cache", 60
    common = ["--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", str(n), "--classnames", str(names),
              "--templates", str(templates)]
    run_cli("eval", *common, "--model_type", "glossary_clip", out=out, cache=cache)
    run_cli("eval", *common, out=out, cache=cache)  # the same Japanese prompts, plain open_clip
    plugin = result(out, "glossary-ja-en/shapes_*.json")
    plain = result(out, "tiny-shapes-clip/shapes_*.json")  # a different experiment: its own file

    ja_classes = [c + s for c in COLOURS_JA for s in SHAPES_JA]
    acc1, per_class = _direct_accuracy([[translate(t.format(c=c)) for t in TEMPLATES_JA] for c in ja_classes], n)
    assert plugin["metrics"]["acc1"] == pytest.approx(acc1, abs=1e-12)
    assert plugin["metrics"]["mean_per_class_recall"] == pytest.approx(per_class, abs=1e-12)
    assert plugin["metrics"]["acc1"] > 0.8  # the glossary makes Japanese prompts readable to the English model
    assert plain["metrics"]["acc1"] < 0.2  # without it they are noise (chance is 0.033)
    assert plugin["experiment"]["checkpoint"].startswith(plain["experiment"]["checkpoint"] + "+glossary:")


def _write_csv_captions(root: Path, n: int) -> Path:
    """The same images and captions as write_image_queries, in the example reader's CSV layout."""
    data_dir = write_image_queries(root, n)
    lines = ["image,caption"]
    for record in (json.loads(line) for line in (data_dir / "image_queries.jsonl").read_text().splitlines()):
        image = (data_dir / record["image_path"]).resolve()
        lines += [f"{os.path.relpath(image, data_dir)},\"{q}\"" for q in record["query"]]
    (data_dir / "test.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data_dir


def test_csv_captions_reader_by_dataset_name_reads_what_the_builtin_reader_reads(tmp_path):
    _installed("clipcache.datasets", "csv_captions")
    data_dir = _write_csv_captions(tmp_path / "data", 14)
    out, cache = tmp_path / "out", tmp_path / "cache"
    for dataset in ("csv_captions", "custom"):  # custom: the built-in image_queries.jsonl reader, same data
        run_cli("eval", "--model", "tiny-shapes-clip", "--dataset", dataset, "--dataset_root", str(data_dir),
                "--recall_k", "1", "5", out=out, cache=cache)
    plugin = result(out, "csv_captions_zeroshot_retrieval.json")
    builtin = result(out, "custom_zeroshot_retrieval.json")
    assert plugin["task"] == "zeroshot_retrieval" and plugin["metrics"] == builtin["metrics"]
    assert plugin["metrics"]["image_retrieval_recall@5"] > 0.5


def test_csv_captions_reader_limit_and_bad_rows(tmp_path):
    from clipcache.tasks.datasets import open_dataset

    _installed("clipcache.datasets", "csv_captions")
    root = tmp_path / "d"
    root.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        (root / name).write_bytes(b"not decoded while indexing")
    (root / "test.csv").write_text("image,caption\na.png,one\nb.png,two\nc.png,three\na.png,uno\n")
    ds = open_dataset("csv_captions", str(root), "test", 2)
    assert len(ds) == 2 and ds.captions == [["one", "uno"], ["two"]]  # the first 2 images, with all their captions
    (root / "test.csv").write_text("image,caption\na.png,one\nmissing.png,two\n")
    with pytest.raises(DatasetError, match=r"test.csv line 3: image 'missing.png' not found"):
        open_dataset("csv_captions", str(root), "test", None)
    (root / "test.csv").write_text("path,text\na.png,one\n")
    with pytest.raises(DatasetError, match="no column image, caption"):
        open_dataset("csv_captions", str(root), "test", None)


def test_an_entry_point_that_is_no_loader_or_reader_is_named(monkeypatch):
    from clipcache.tasks.datasets import DATASETS, registered_task
    from clipcache.tasks.models import LOADERS
    from clipcache.tasks.models.resolve import get_loader

    for registry, name in ((LOADERS, "json_loader"), (DATASETS, "json_reader")):
        monkeypatch.setitem(registry._entries, name, "json:__version__")
        monkeypatch.setitem(registry._origin, name, "entry point x = json:__version__ (fake-package)")
    with pytest.raises(ModelError, match=r"model type 'json_loader' \(entry point .*fake-package\)\) is not a "
                                         r"ModelLoader \(got str\)"):
        get_loader("json_loader")
    with pytest.raises(DatasetError, match=r"dataset 'json_reader' .* is not a dataset reader \(got str\)"):
        registered_task("json_reader")


# -- broken plugin packages, in a fresh interpreter (entry points are read once per process) --------------------------

def _fake_distribution(site: Path, dist: str, entry_points_txt: str) -> Path:
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points_txt))
    return site


def _clipcache(site: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    code = "import sys; from clipcache.flows.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv, "--output_dir", "out", "--cache_dir", "cache",
                           "--quiet", "--orchestrator", "local"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> Path:
    return _fake_distribution(tmp_path_factory.mktemp("site"), "broken_plugins", """
        [clipcache.models]
        broken_loader = no_such_module_xyz:LOADER
        [clipcache.datasets]
        broken_reader = no_such_module_xyz:Reader
    """)


def test_a_plugin_that_fails_to_import_is_one_line_when_used(broken_site, tmp_path):
    run = _clipcache(broken_site, "eval", "--model", "tiny-shapes-clip", "--model_type", "broken_loader", "--dataset",
                     "shapes", "--limit", "4", cwd=tmp_path)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert "model type 'broken_loader' (entry point broken_loader = no_such_module_xyz:LOADER (broken_plugins)) " \
           "cannot be imported: ModuleNotFoundError: No module named 'no_such_module_xyz'" in line

    run = _clipcache(broken_site, "eval", "--model", "tiny-shapes-clip", "--dataset", "broken_reader", cwd=tmp_path)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    # (the same package's broken loader is also warned about: --model_type auto left it out)
    [line] = [line for line in run.stderr.strip().splitlines() if "WARNING" not in line]
    assert "dataset 'broken_reader' (entry point broken_reader = no_such_module_xyz:Reader (broken_plugins)) " \
           "cannot be imported" in line


def test_a_broken_loader_plugin_does_not_stop_other_models(broken_site, tmp_path):
    run = _clipcache(broken_site, "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "4",
                     cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("model loader left out: model type 'broken_loader'") == 1  # warned once, not per check
    assert list((tmp_path / "out" / "tiny-shapes-clip").glob("shapes_zeroshot_classification.limit4.json"))


def test_a_plugin_reusing_a_builtin_name_is_one_line(tmp_path_factory, tmp_path):
    site = _fake_distribution(tmp_path_factory.mktemp("site"), "shadowing_plugin", """
        [clipcache.models]
        open_clip = shadowing_plugin:LOADER
    """)
    run = _clipcache(site, "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", cwd=tmp_path)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert "entry point open_clip = shadowing_plugin:LOADER (shadowing_plugin) registers model type 'open_clip', " \
           "which is already registered by clipcache; uninstall one of the two packages" in line


# -- a task from an installed package: its options are flags, its metrics are in the catalog -------------------------

def _example_task_site(site: Path, module: str, source: str) -> Path:
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    return _fake_distribution(site, f"{module}_dist", f"""
        [clipcache.tasks]
        image_knn = {module}:ImageKnn
    """)


def _run(site: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "COLUMNS": "200"}
    code = "import sys; from clipcache.flows.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_plugin_tasks_options_are_flags_like_a_builtins(tmp_path_factory, tmp_path):
    """docs/extending.md's example task, shipped as a package (an entry point, no TASKS.register): `eval --help`
    lists its option, and a run takes it (another experiment than the default one), as does an evalscope task config."""
    from test_extending import examples

    source = examples()["task-define"]
    registration = 'TASKS.register("image_knn", ImageKnn)\n'
    assert registration in source  # the entry point registers it instead
    site = _example_task_site(tmp_path_factory.mktemp("site"), "knn_task_plugin", source.replace(registration, ""))

    shown = _run(site, "eval", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    plugin_part = shown.stdout.split("options of tasks from plugins:")[1]
    assert "--image_knn_include_self" in plugin_part and "image_knn: count each image among its own k" in plugin_part

    # what a run's pairs get (no model loaded here: tests/test_extending.py runs the same task and flag end to end)
    code = textwrap.dedent("""
        import json
        from clipcache.flows.cli.app import build_parser, params_from_args
        from clipcache.tasks.evaluation import get_task, metric_catalog
        from clipcache.tasks.contract import ScoreSettings
        argv = ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--task", "image_knn"]
        task = get_task("image_knn")
        found = {}
        for extra in ([], ["--image_knn_include_self"]):
            params = params_from_args(build_parser("eval").parse_args(argv + extra))
            [options] = params.run_settings(cached_only=False).options.for_task(task.Options)
            found[" ".join(extra)] = task.options(ScoreSettings(options=options))
        from clipcache.flows.config.evalscope import parse_task_config  # an evalscope task config takes it too
        [params] = parse_task_config({"eval_config": {"tool": "clip_benchmark", "eval": {
            "models": [{"model_name": "tiny-shapes-clip"}], "dataset_name": ["shapes"], "task": "image_knn",
            "image_knn_include_self": True}}})
        [options] = params.run_settings(cached_only=False).options.for_task(task.Options)
        found["task_cfg"] = task.options(ScoreSettings(options=options))
        print(json.dumps([found, metric_catalog()["image_knn_precision"].higher_is_better]))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        {"": {}, "--image_knn_include_self": {"image_knn_include_self": True},
         "task_cfg": {"image_knn_include_self": True}}, True]


def test_a_plugin_option_declared_unlike_a_builtin_one_is_one_line(tmp_path_factory, tmp_path):
    source = textwrap.dedent("""
        from clipcache.tasks.evaluation.zeroshot_classification import ZeroShotClassification
        from clipcache.tasks.evaluation.base import TaskOptions


        class ImageKnn(ZeroShotClassification):
            name = "image_knn"

            class Options(TaskOptions):
                seed: str = "zero"  # linear_probe's and image_clustering's --seed is an int
    """)
    site = _example_task_site(tmp_path_factory.mktemp("site"), "clashing_task_plugin", source)
    run = _run(site, "eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", cwd=tmp_path)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert "task image_knn declares option 'seed' differently from task linear_probe" in line


def test_a_plugin_tasks_options_are_in_deployment_schemas_and_reach_the_task(tmp_path_factory, tmp_path):
    """Prefect deployments of the evaluate / rescore flows (and the nightly suite's overrides), built every way clipcache builds them (prefect.yaml
    through `runner_deployments`, as `clipcache serve` does; a flow loaded from its entrypoint with Prefect's
    `parameter_schema`, as `prefect deploy` does), carry a plugin task's option in their parameter schema; the
    schema check the Prefect server makes (enforce_parameter_schema) accepts a run with it, and Prefect's own
    parameter validation, which a worker runs before the flow, hands it to the task. No server is started."""
    from test_extending import examples

    source = examples()["task-define"].replace('TASKS.register("image_knn", ImageKnn)\n', "")
    site = _example_task_site(tmp_path_factory.mktemp("site"), "knn_deploy_plugin", source)
    (tmp_path / "suite.yaml").write_text("models: [{model_name: tiny-shapes-clip}]\ndatasets: [shapes]\n")
    (tmp_path / "prefect.yaml").write_text(textwrap.dedent("""
        deployments:
          - name: knn
            entrypoint: clipcache.flows.orchestration.flows:evaluate
            parameters:
              params: {models: [{model_name: tiny-shapes-clip}], datasets: [shapes], task: image_knn}
          - name: knn-rescore
            entrypoint: clipcache.flows.orchestration.flows:rescore
          - name: nightly
            entrypoint: clipcache.flows.orchestration.flows:evaluate_suite
    """))
    code = textwrap.dedent("""
        import json
        from prefect.flows import load_flow_from_entrypoint
        from prefect.utilities.callables import parameter_schema
        from prefect.utilities.schema_tools import validate
        from clipcache.flows.orchestration.deployments import load_suite, runner_deployments
        from clipcache.tasks.contract import ScoreSettings
        from clipcache.tasks.evaluation import get_task

        task = get_task("image_knn")
        given = {"models": [{"model_name": "tiny-shapes-clip"}], "datasets": ["shapes"], "task": "image_knn",
                 "image_knn_include_self": True}
        found = {}
        deployments = {d.name: d for d in runner_deployments("prefect.yaml")}
        deployed = parameter_schema(load_flow_from_entrypoint("clipcache.flows.orchestration.flows:evaluate"))
        for name, schema in [(n, d._parameter_openapi_schema) for n, d in deployments.items() if n != "nightly"] + \\
                [("prefect deploy", deployed)]:
            model = schema.model_dump()["definitions"]["EvaluateParams"]
            validate({"params": given}, schema.model_dump(), raise_on_error=True)  # the server's check
            found[name] = [model["properties"]["image_knn_include_self"]["description"],
                           model["additionalProperties"]]
        nightly = deployments["nightly"]._parameter_openapi_schema.model_dump()  # the suite's overrides
        validate({"params": {"suite": "suite.yaml", "overrides": {"image_knn_include_self": True}}}, nightly,
                 raise_on_error=True)
        overrides = nightly["definitions"]["SuiteOverrides"]
        found["nightly"] = [overrides["properties"]["image_knn_include_self"]["description"],
                            overrides["additionalProperties"]]
        suite_flow = load_flow_from_entrypoint("clipcache.flows.orchestration.flows:evaluate_suite")
        suite = suite_flow.validate_parameters({"params": {"suite": "suite.yaml", "overrides": {
            "task": "image_knn", "image_knn_include_self": True}}})["params"]
        flow = load_flow_from_entrypoint("clipcache.flows.orchestration.flows:evaluate")
        params = flow.validate_parameters({"params": given})["params"]  # what a worker does before the flow runs
        from clipcache.flows.config.params import EvaluateParams  # docs/production.md's call still validates
        plain = flow.validate_parameters({"params": EvaluateParams(models=given["models"], datasets=["shapes"])})
        found["plain"] = [type(plain["params"]) is type(params), plain["params"].image_knn_include_self]
        for params in (params, load_suite("suite.yaml", {"task": "image_knn", "image_knn_include_self": True}),
                       load_suite(suite.suite, suite.overrides)):
            [options] = params.run_settings(cached_only=False).options.for_task(task.Options)
            found.setdefault("reached", []).append(task.options(ScoreSettings(options=options)))
        print(json.dumps(found))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "PREFECT_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    described = ["image_knn: count each image among its own k neighbours", False]
    assert found == {"knn": described, "knn-rescore": described, "prefect deploy": described, "nightly": described,
                     "plain": [True, False], "reached": [{"image_knn_include_self": True}] * 3}
