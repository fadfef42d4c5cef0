"""Every original layout of clip_benchmark's builder that clipcache reads (tasks/datasets/clip_benchmark/layouts.json),
on tiny generated folders (tests/layout_fixtures.py): clipcache's reader yields the same samples as clip_benchmark's own
``build_dataset`` on the same folder (pixels, labels or captions, order, class names, templates), and one layout of
each reader family scores equal to clip_benchmark's ``evaluate()``."""

from __future__ import annotations

import hashlib

import numpy as np
import open_clip
import pytest
import torch
from clip_benchmark.datasets.builder import build_dataset, get_dataset_collate_fn
from clip_benchmark.metrics import zeroshot_classification, zeroshot_retrieval

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import ClipcacheError, DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.clip_benchmark.layouts import layouts, task_of
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, PromptSettings, ScoreSettings
from clipcache.tasks.evaluation.common import class_prompts
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from tests.layout_fixtures import SPLITS, no_integrity_checks, write_layout

# cifar10/100, imagenet1k, babel_imagenet and flickr have their own tests (tests/test_original_layouts.py).
OWN_TESTS = {"cifar10", "cifar100", "imagenet1k", "flickr30k", "flickr8k", "babel_imagenet", "birdsnap"}
NAMES = sorted(n for n in layouts() if n not in OWN_TESTS)
CASES = [(n, s) for n in NAMES for s in SPLITS[n]]
MULTILINGUAL = {"multilingual_mscoco_captions": "it", "crossmodal3600": "fr", "xtd10": "jp", "xtd200": "deu_Latn",
                "flickr30k-200": "deu_Latn"}


@pytest.fixture
def integrity(monkeypatch):
    no_integrity_checks(monkeypatch)


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def their_samples(name: str, root, split: str, language: str):
    ds = build_dataset(dataset_name=name, root=str(root), transform=None, split=split, download=False,
                       language=language, task=task_of(name))
    return ds, [ds[i] for i in range(len(ds))]


def test_every_layout_has_a_fixture():
    assert set(NAMES) <= set(SPLITS)


@pytest.mark.parametrize("name, split", CASES)
def test_reader_yields_clip_benchmarks_samples(tmp_path, integrity, name, split):
    language = MULTILINGUAL.get(name, "en")
    root = write_layout(name, tmp_path / "data", split, language)
    ds, samples = their_samples(name, root, split, language)
    ours = open_dataset(name, str(root), split, None, language=language)
    assert len(ours) == len(samples) > 0
    if task_of(name) == "zeroshot_retrieval":
        assert ours.captions == [list(target) for _, target in samples]
        for i, (image, _) in enumerate(samples):
            assert np.array_equal(pixels(ours.load_image(i)), pixels(image)), i
        return
    assert ours.prompts.classnames == list(ds.classes) and ours.prompts.templates == list(ds.templates)
    theirs = [(np.asarray(label).tolist(), pixels(image)) for image, label in samples]
    mine = [(np.asarray(ours.labels[i]).tolist(), pixels(ours.load_image(i))) for i in range(len(ours))]
    if name == "imagenetv2":  # clip_benchmark lists files in the file system's order; compare as multisets
        def key(sample):
            return sample[0], hashlib.sha256(sample[1].tobytes()).hexdigest()
        theirs, mine = sorted(theirs, key=key), sorted(mine, key=key)
    assert [label for label, _ in mine] == [label for label, _ in theirs]
    for i, ((_, a), (_, b)) in enumerate(zip(mine, theirs, strict=True)):
        assert np.array_equal(a, b), i


def test_limit_reads_the_first_samples(tmp_path, integrity):
    root = write_layout("food101", tmp_path / "data", "test")
    full, first = open_dataset("food101", str(root), "test", None), open_dataset("food101", str(root), "test", 3)
    assert len(first) == 3 and first.labels.tolist() == full.labels[:3].tolist()
    assert first.identity(FileHashMemo(None)) != full.identity(FileHashMemo(None))


def session():
    memo = FileHashMemo(None)
    return memo, ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                              amp=False, precision="fp32")


# One layout per reader family, scored by both tools with the bundled model.
MAX_PROMPTS = 2000  # classes x templates above which both tools score with the first two templates
SCORED = [("mnist", "en"), ("food101", "en"), ("imagenet-r", "en"), ("imagenet-r", "jp"), ("caltech101", "en"),
          ("fer2013", "en"), ("objectnet", "en"), ("voc2007", "en"), ("voc2007_multilabel", "en"),
          ("mscoco_captions", "en"), ("xtd10", "it")]


@pytest.mark.parametrize("name, language", SCORED)
def test_scores_equal_clip_benchmark(tmp_path, tiny_model_dir, integrity, name, language):
    root = write_layout(name, tmp_path / "data", "test", language)
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}", device="cpu")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{tiny_model_dir}")
    task = task_of(name)
    ds = build_dataset(dataset_name=name, root=str(root), transform=transform, split="test", download=False,
                       language=language, task=task)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False, num_workers=0,
                                         collate_fn=get_dataset_collate_fn(name))
    prompts = PromptSettings(language=language)
    if task == "zeroshot_retrieval":
        theirs = zeroshot_retrieval.evaluate(model, loader, tokenizer, "cpu", amp=False, recall_k_list=[1, 3])
    else:
        templates = ds.templates
        if isinstance(templates, list) and len(ds.classes) * len(templates) > MAX_PROMPTS:
            # Both tools' full class names and templates (in this language) are checked equal; both then score
            # with the first two templates, as test_original_layouts.py does for ImageNet: the 16,000-25,000
            # prompts of ImageNet-R or ObjectNet would be most of this file's time and test nothing more.
            ours, _ = class_prompts(open_dataset(name, str(root), "test", None, language=language), prompts)
            assert ours.classnames == ds.classes and ours.templates == templates
            templates = templates[:2]
            (tmp_path / "two.txt").write_text("\n".join(templates) + "\n", encoding="utf-8")
            prompts = PromptSettings(language=language, templates=str(tmp_path / "two.txt"))
        theirs = zeroshot_classification.evaluate(model, loader, tokenizer, ds.classes, templates, "cpu", amp=False)
    memo, model_session = session()
    scored = evaluate_one(task, model_session, DataSource(name, str(root), "test", language=language),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(16, 2),
                          score=ScoreSettings(recall_k=(1, 3), batch_size=16), prompts=prompts)
    for key, value in theirs.items():
        if isinstance(value, float) and np.isnan(value):
            assert np.isnan(scored.metrics[key]), key
        else:
            assert scored.metrics[key] == pytest.approx(value, abs=1e-12), key


def test_missing_layouts_name_the_file_and_where_it_comes_from(tmp_path):
    cases = {"food101": r"food-101 not found; clip_benchmark reads it with torchvision's Food101 \(files: https://",
             "caltech101": r"caltech101/101_ObjectCategories not found \(files: https://data.caltech.edu",
             "xtd10": r"xtd10-en.json not found \(clip_benchmark writes it with "
                      r"clip_benchmark.datasets.xtd10.create_annotation_file",
             "mscoco_captions": r"nor is clip_benchmark's original layout there: .*coco_\{split\}_karpathy.json",
             "imagenet-a": r"nor is clip_benchmark's original layout there: <wnid> \(files: https://people.eecs"}
    for name, message in cases.items():
        with pytest.raises(DatasetError, match=message):
            open_dataset(name, str(tmp_path), "test", None)


def test_wrong_split_and_language_are_one_clear_error(tmp_path, integrity):
    root = write_layout("pets", tmp_path / "data", "test")
    with pytest.raises(DatasetError, match=r"dataset 'pets' has the splits trainval, test \(asked for 'train'\)"):
        open_dataset("pets", str(root), "train", None)
    with pytest.raises(DatasetError, match=r"language: 'xx' is not available for dataset 'xtd10' \(available: "):
        open_dataset("xtd10", str(root), "test", None, language="xx")
    memo, model_session = session()
    with pytest.raises(ClipcacheError, match=r"language: 'cn' is not available for dataset 'pets' \(available: en"):
        evaluate_one("zeroshot_classification", model_session, DataSource("pets", str(root), "test", language="cn"),
                     EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(16, 2),
                     score=ScoreSettings(batch_size=16), prompts=PromptSettings(language="cn"))


def test_a_wnid_subset_folder_outside_the_subset_is_named(tmp_path):
    root = tmp_path / "imagenet-a"
    (root / "n01440764").mkdir(parents=True)  # tench: ImageNet-1k, not one of imagenet-a's 200
    with pytest.raises(DatasetError, match=r"n01440764 is not one of the 200 WordNet ids of imagenet-a"):
        open_dataset("imagenet-a", str(root), "test", None)


def test_annotation_file_replaces_the_default_captions_and_makes_its_own_experiment(tmp_path):
    import json

    from clipcache.tasks.identity import annotation_option

    root = write_layout("mscoco_captions", tmp_path / "data", "test")
    data = json.loads((root / "coco_test_karpathy.json").read_text())
    data["images"] = sorted(data["images"], key=lambda image: image["id"])[:2]  # read in id order
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in {i["id"] for i in data["images"]}]
    other = tmp_path / "two.json"
    other.write_text(json.dumps(data))
    full = open_dataset("mscoco_captions", str(root), "test", None)
    two = open_dataset("mscoco_captions", str(root), "test", None, annotation_file=str(other))
    assert len(two) == 2 < len(full) and two.captions == full.captions[:2]
    assert two.identity(FileHashMemo(None)) != full.identity(FileHashMemo(None))
    assert annotation_option(None) == {} and annotation_option(str(other))["annotation_file"].startswith("two.json@")
    with pytest.raises(DatasetError, match=r"missing.json not found"):
        open_dataset("mscoco_captions", str(root), "test", None, annotation_file=str(tmp_path / "missing.json"))


def test_languages_of_a_caption_set_share_one_image_entry(tmp_path):
    """xtd10's languages list the same images: the second language encodes its captions only."""
    root = tmp_path / "data"
    for language in ("en", "it"):
        write_layout("xtd10", root, "test", language)
    memo, model_session = session()
    store = EmbeddingStore(tmp_path / "cache")
    for language in ("en", "it"):
        evaluate_one("zeroshot_retrieval", model_session, DataSource("xtd10", str(root), "test", language=language),
                     store, memo, encode=EncodeSettings(16, 2), score=ScoreSettings(recall_k=(1, 3), batch_size=16),
                     prompts=PromptSettings(language=language))
    assert len(store.keys()) == 3  # one image entry, a caption entry per language


def test_crossmodal3600_without_its_annotation_file_reads_the_downloaded_captions(tmp_path):
    """clip_benchmark builds crossmodal3600's annotation file offline from xm3600/captions.jsonl; so does clipcache
    (in memory): the same samples as clip_benchmark's file."""
    root = write_layout("crossmodal3600", tmp_path / "data", "test", "fr")
    with_file = open_dataset("crossmodal3600", str(root), "test", None, language="fr")
    (root / "crossmodal3600_captions-fr.json").unlink()
    without = open_dataset("crossmodal3600", str(root), "test", None, language="fr")
    assert without.captions == with_file.captions and without.paths == with_file.paths
    _, samples = their_samples("crossmodal3600", root, "test", "fr")  # clip_benchmark writes the file again
    assert without.captions == [list(target) for _, target in samples]
