"""Contract tests over the registries and catalogs."""

from __future__ import annotations

import pytest

from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import DATASETS, SOURCES, catalog, check_name, default_task, open_dataset
from clipcache.tasks.datasets.base import DATASET_TASKS
from clipcache.tasks.evaluation import TASKS
from clipcache.tasks.models import LOADERS
from clipcache.tasks.registry import Registry
from clipcache.tasks.score.metrics import flat_metric_name, split_metric_name


def test_registry_lazy_duplicates_and_suggestions():
    reg: Registry = Registry("widget", DatasetError)
    reg.register("json_dumps", "json:dumps")
    import json

    assert reg.get("json_dumps") is json.dumps
    with pytest.raises(ValueError, match="already registered"):
        reg.register("json_dumps", "json:loads")
    with pytest.raises(DatasetError, match="Unknown widget 'json_dump'. Did you mean: json_dumps?"):
        reg.get("json_dump")

    @reg.register("double")
    def double(x):
        return 2 * x

    assert reg.get("double")(2) == 4 and reg.names() == ["double", "json_dumps"]


@pytest.mark.parametrize("name", DATASETS.names())
def test_every_registered_dataset_loader_imports_and_declares_its_task(name):
    """Built-in readers and installed plugins' (entry point group clipcache.datasets) alike: the task a reader
    declares is one an image dataset can serve."""
    from clipcache.tasks.datasets import get_reader, registered_task

    assert callable(get_reader(name)) and registered_task(name) in DATASET_TASKS


@pytest.mark.parametrize("name", SOURCES.names())
def test_every_dataset_source_imports_and_describes_itself(name):
    from clipcache.tasks.datasets import get_source
    from clipcache.tasks.datasets.source import DatasetSource

    source = get_source(name)
    assert isinstance(source, DatasetSource) and source.name == name and source.description
    assert isinstance(source.priority, int) and set(source.only_for) <= set(TASKS)


@pytest.mark.parametrize("name", sorted({*DATASETS.names(), *catalog(), "wds/anything"}))
def test_every_dataset_name_is_claimed_and_its_task_is_a_registered_task(name, tmp_path):
    """--task auto must land on a task the pipeline can run, with a root and without."""
    for root in (None, str(tmp_path / "{dataset}")):
        check_name(name, root)
        assert default_task(name, root) in TASKS


def test_every_original_layout_names_a_reader_and_a_registered_task():
    from clipcache.tasks.datasets.clip_benchmark.layout_readers import READERS
    from clipcache.tasks.datasets.clip_benchmark.layouts import describe, layouts, task_of

    for name, entry in layouts().items():
        assert entry["reader"] in READERS, name
        check_name(name)
        assert task_of(name) in TASKS and default_task(name, None) in TASKS and describe(name)


@pytest.mark.parametrize("name", LOADERS.names())
def test_every_model_loader_imports_and_describes_itself(name):
    """Built-in loaders and installed plugins' (entry point group clipcache.models) alike."""
    from clipcache.tasks.models.loader import ModelLoader
    from clipcache.tasks.models.resolve import get_loader

    loader = get_loader(name)
    assert isinstance(loader, ModelLoader) and loader.description and isinstance(loader.priority, int)


def test_catalog_has_the_43_benchmark_datasets_each_with_a_task():
    cat = catalog()
    assert len(cat) == 43
    assert {row["task"] for row in cat.values()} <= set(DATASET_TASKS)
    assert cat["muge"]["task"] == "zeroshot_retrieval" and cat["imagenet1k"]["task"] == "zeroshot_classification"


@pytest.mark.parametrize("name", sorted(catalog()))
def test_every_catalog_name_resolves_to_the_webdataset_loader(name, tmp_path):
    check_name(name)
    with pytest.raises(DatasetError, match="does not exist"):  # resolved, then looked for under the given root
        open_dataset(name, str(tmp_path / "{dataset}"), "test", None)


@pytest.mark.parametrize("flat", ["acc1", "acc5", "mean_per_class_recall", "mean_average_precision",
                                  "image_retrieval_recall@5", "text_retrieval_recall@10", "skipped_images"])
def test_metric_names_round_trip_and_declare_a_direction(flat):
    from clipcache.tasks.evaluation import metric_catalog

    info, k = split_metric_name(flat, metric_catalog())
    assert flat_metric_name(info.name, k) == flat
    assert isinstance(info.higher_is_better, bool) and info.definition


def test_every_metric_declares_direction():
    from clipcache.tasks.evaluation import metric_catalog

    catalog = metric_catalog()
    assert {"lp_acc", "knn_acc1", "CIDEr", "avg_jaccard_score", "acc", "skipped_images"} <= set(catalog)
    for info in catalog.values():
        assert isinstance(info.higher_is_better, bool) and isinstance(info.has_k, bool)
