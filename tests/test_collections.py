"""clip_benchmark's --dataset collections and files of names, its vtab/<x> spelling, and --dump_classnames /
--dump_templates."""

from __future__ import annotations

import json

import pytest
from clip_benchmark.datasets.builder import dataset_collection

from clipcache.flows.config.params import EvaluateParams
from clipcache.storage.errors import ConfigError
from clipcache.tasks.datasets import catalog
from clipcache.tasks.datasets.clip_benchmark.collections import canonical, dataset_collections


def params(datasets, **kw):
    return EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=datasets, **kw)


def test_the_collections_are_clip_benchmarks():
    assert dataset_collections() == dataset_collection


@pytest.mark.parametrize("collection", sorted(dataset_collection))
def test_every_collection_expands_to_names_clipcache_knows(collection):
    names = params([collection]).datasets
    assert names == list(dict.fromkeys(canonical(n) for n in dataset_collection[collection]))
    assert not any(n.startswith("vtab/") for n in names)  # the catalog's spelling


def test_a_file_of_names_mixed_with_names_and_collections(tmp_path):
    listing = tmp_path / "mine.txt"
    listing.write_text("shapes\n# a comment\n\nvtab/cifar10\nshapes\n")
    assert params([str(listing), "retrieval"]).datasets == ["shapes", "vtab_cifar10", "mscoco_captions", "flickr8k",
                                                            "flickr30k"]
    assert "vtab_cifar10" in catalog()
    (tmp_path / "empty.txt").write_text("\n# nothing\n")
    with pytest.raises(ConfigError, match="datasets: .*empty.txt lists no dataset names"):
        from clipcache.flows.config.params import validate

        validate(EvaluateParams, {"models": [{"model_name": "tiny-shapes-clip"}],
                                  "datasets": [str(tmp_path / "empty.txt")]})
    with pytest.raises(Exception, match="Unknown dataset 'vtab/cifar11'"):
        params(["vtab/cifar11"])


def test_dump_classnames_and_templates_reach_both_json_files(tmp_path, capsys):
    from clipcache.flows.cli import main
    from clipcache.tasks.datasets.shapes import CLASSNAMES, TEMPLATES

    out = tmp_path / "out"
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes", "shapes_retrieval", "--limit", "12",
                 "--quiet", "--orchestrator", "local", "--dump_classnames", "--dump_templates", "--output",
                 str(tmp_path / "cb_{dataset}_{task}.json"), "--output_dir", str(out), "--cache_dir",
                 str(tmp_path / "cache")]) == 0
    ours = json.loads((out / "tiny-shapes-clip" / "shapes_zeroshot_classification.limit12.json").read_text())
    theirs = json.loads((tmp_path / "cb_shapes_zeroshot_classification.json").read_text())
    for saved in (ours, theirs):
        assert saved["classnames"] == CLASSNAMES and saved["templates"] == TEMPLATES
    retrieval = json.loads((tmp_path / "cb_shapes_retrieval_zeroshot_retrieval.json").read_text())
    assert "classnames" not in retrieval  # as clip_benchmark: only datasets that have them
