"""--language for zero-shot classification: ImageNet-1k and its variants/subsets in en, cn, jp, ar, it."""

from __future__ import annotations

import json

import pytest

from clipcache.storage.errors import ConfigError
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.base import ClassPrompts
from clipcache.tasks.datasets.clip_benchmark.languages import imagenet_prompts, languages, localize

from conftest import write_wds


def test_data_file_has_five_languages_of_1000_classes():
    assert languages() == ["ar", "cn", "en", "it", "jp"]
    for lang, data in imagenet_prompts().items():
        assert len(data["classnames"]) == 1000 and all("{c}" in t for t in data["templates"]), lang


def test_a_200_class_subset_maps_class_by_class():
    data = imagenet_prompts()
    picked = [1, 7, 42, 999]  # a subset as in imagenet-a / -r / -o
    subset = ClassPrompts([data["en"]["classnames"][i] for i in picked], ["a photo of a {c}."])
    cn = localize(subset, "imagenet-a", "cn")
    assert cn.classnames == [data["cn"]["classnames"][i] for i in picked]
    assert cn.templates == data["cn"]["templates"] and cn.language == "cn"
    assert localize(subset, "imagenet-a", "en") is subset


@pytest.mark.parametrize("language", ["cn", "jp", "ar", "it"])
def test_the_1000_classes_map_one_to_one_despite_the_two_repeated_english_names(language):
    """ImageNet's English list names "missile" (657, 744) and "sunglasses" (836, 837) twice; each class keeps its own
    name in the other language, as clip_benchmark's per-language lists have them."""
    data = imagenet_prompts()
    full = localize(ClassPrompts(list(data["en"]["classnames"]), ["a photo of a {c}."]), "imagenet1k", language)
    assert full.classnames == data[language]["classnames"]
    picked = [657, 836]  # the first of each pair, alone, as ImageNet-R keeps "missile" (657)
    subset = localize(ClassPrompts([data["en"]["classnames"][i] for i in picked], ["a {c}"]), "imagenet-r", language)
    assert subset.classnames == [data[language]["classnames"][i] for i in picked]


def test_other_datasets_name_their_languages():
    with pytest.raises(ConfigError, match=r"'jp' is not available for dataset 'shapes' \(available: en;"):
        localize(ClassPrompts(["red circle"], ["a {c}"]), "shapes", "jp")


def test_language_on_a_webdataset_source_end_to_end(prefect_server, tmp_path):
    """clip_benchmark ignores --language for wds sources; here the Chinese names and templates are used."""
    from clipcache.flows.config.params import EvaluateParams
    from clipcache.flows.orchestration.flows import evaluate

    root = write_wds(tmp_path / "imagenet-a", "classification", 12, shards=1, n_classes=6)
    names = imagenet_prompts()["en"]["classnames"]
    (root / "classnames.txt").write_text("\n".join(names[i] for i in (0, 1, 2, 3, 4, 5)) + "\n")
    ds = open_dataset("wds/imagenet-a", str(root), "test", None)
    assert localize(ds.prompts, "imagenet-a", "cn").classnames[1] == "金鱼"
    params = EvaluateParams(models=[{"model_name": "tiny-shapes-clip"}], datasets=["wds/imagenet-a"],
                            dataset_root=str(root), language="cn", output_dir=str(tmp_path / "o"),
                            cache_dir=str(tmp_path / "c"), verbose=False, output=str(tmp_path / "cb.json"))
    en = evaluate(params.model_copy(update={"language": ["en"], "output": None}))[0]
    cn = evaluate(params)[0]
    assert cn.metrics != en.metrics and en.cache_hit is False and not cn.resumed
    assert json.loads((tmp_path / "cb.json").read_text())["language"] == "cn"


def test_classname_and_template_files_per_dataset(tmp_path):
    prompts = ClassPrompts(["a", "b"], ["x {c}"])
    per_dataset = tmp_path / "templates.json"
    per_dataset.write_text(json.dumps({"cifar10": ["a photo of a {c}.", "a {c}."]}))
    assert prompts.override(None, str(per_dataset), "cifar10").templates == ["a photo of a {c}.", "a {c}."]
    assert prompts.override(None, str(per_dataset), "shapes").templates == ["x {c}"]  # not named: unchanged
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\n")
    assert prompts.override(str(names), None, "anything").classnames == ["cat", "dog"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cifar10": "not a list"}))
    with pytest.raises(ConfigError, match="JSON list of strings"):
        prompts.override(None, str(bad), "cifar10")
