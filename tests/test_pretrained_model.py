"""``--pretrained_model`` as LAION clip_benchmark takes it: ARCH,PRETRAINED pairs, collection names and files; the
collections equal clip_benchmark's own, and expanding them needs no network."""

from __future__ import annotations

import json

import pytest

from clipcache.flows.cli import main
from clipcache.storage.errors import ConfigError
from clipcache.tasks.models.collections import collection_names, expand_pretrained_models


@pytest.mark.parametrize("name", ["openai", "openclip_base", "openclip_multilingual", "openclip_all"])
def test_collections_equal_clip_benchmarks(name):
    from clip_benchmark.model_collection import model_collection

    assert expand_pretrained_models([name]) == [tuple(pair) for pair in model_collection[name]]


def test_file_of_pairs_reads_like_clip_benchmark_and_mixes_with_names(tmp_path):
    from clip_benchmark.model_collection import get_model_collection_from_file

    plain = tmp_path / "models.txt"
    plain.write_text("ViT-B-32,laion2b_s34b_b79k\nViT-B-16,openai\n")
    assert expand_pretrained_models([str(plain)]) == [tuple(p) for p in get_model_collection_from_file(plain)]
    commented = tmp_path / "commented.txt"
    commented.write_text("# nightly\nViT-B-32 , openai\n\nRN50,\n")
    assert expand_pretrained_models(["openai", str(commented), "ViT-L-14,laion2b_s32b_b82k"]) == [
        *[("ViT-B-32", "openai"), ("ViT-B-16", "openai"), ("ViT-L-14", "openai"), ("ViT-L-14-336", "openai")],
        ("ViT-B-32", "openai"), ("RN50", None), ("ViT-L-14", "laion2b_s32b_b82k")]


def test_bad_items_name_the_item_or_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"'opnai' is not ARCH,PRETRAINED, a collection \(.*\) or an existing "
                                          r"file. Did you mean: openai\?"):
        expand_pretrained_models(["opnai"])
    bad = tmp_path / "models.txt"
    bad.write_text("ViT-B-32,openai\nViT-B-16 openai\n")
    with pytest.raises(ConfigError, match=r"models.txt line 2: 'ViT-B-16 openai' is not ARCH,PRETRAINED"):
        expand_pretrained_models([str(bad)])
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="lists no ARCH,PRETRAINED line"):
        expand_pretrained_models([str(tmp_path / "empty.txt")])
    assert collection_names() == ["openai", "openclip_all", "openclip_base", "openclip_multilingual"]


def test_a_file_of_models_evaluates_each(tmp_path, capsys):
    models = tmp_path / "models.txt"
    models.write_text("tiny-shapes-clip,\n")
    code = main(["eval", "--pretrained_model", str(models), "--dataset", "shapes", "--limit", "30", "--quiet",
                 "--orchestrator", "local", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "c")])
    assert code == 0, capsys.readouterr().err
    saved = json.loads((tmp_path / "out" / "tiny-shapes-clip" / "shapes_zeroshot_classification.limit30.json")
                       .read_text())
    assert saved["metrics"]["acc1"] > 0.5


def test_a_collection_offline_fails_on_its_first_download_in_one_line(tmp_path, capsys):
    """Expansion and validation need no network; the weights do, and the loader says so."""
    code = main(["eval", "--pretrained_model", "openai", "--dataset", "shapes", "--limit", "2", "--quiet",
                 "--orchestrator", "local", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    [line] = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert "could not load open_clip model 'ViT-B-32' (pretrained='openai')" in line
