"""clip_benchmark's original (torchvision) layouts, read from generated files in that layout and scored equal to
clip_benchmark's own builder, data loader and evaluate() on the same folder."""

from __future__ import annotations

import pickle

import numpy as np
import open_clip
import pytest
import torch
import torchvision
from clip_benchmark.datasets.builder import build_dataset
from clip_benchmark.metrics import zeroshot_classification

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, PromptSettings, ScoreSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec


def write_cifar(root, name="cifar10", n_test=40, n_train=30):
    """torchvision's layout, filled with shapes images scaled to 32 x 32; labels from the shapes colours."""
    from clipcache.tasks.datasets import shapes

    n_classes = 10 if name == "cifar10" else 100
    folder = root / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True)
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n_test + n_train)
    rows = np.stack([np.asarray(ds.load_image(i).resize((32, 32))).transpose(2, 0, 1).reshape(-1)
                     for i in range(len(ds))]).astype(np.uint8)
    labels = [int(x) % n_classes for x in ds.labels]
    names = [f"class {i}" for i in range(n_classes)]
    key = "labels" if name == "cifar10" else "fine_labels"

    def dump(file, lo, hi):
        with open(folder / file, "wb") as f:
            pickle.dump({"data": rows[lo:hi], key: labels[lo:hi]}, f)

    if name == "cifar10":
        dump("test_batch", 0, n_test)
        per = n_train // 5
        for b in range(5):
            dump(f"data_batch_{b + 1}", n_test + b * per, n_test + (b + 1) * per)
        meta = {"label_names": names}
        meta_file = "batches.meta"
    else:
        dump("test", 0, n_test)
        dump("train", n_test, n_test + n_train)
        meta = {"fine_label_names": names, "coarse_label_names": ["all"]}
        meta_file = "meta"
    with open(folder / meta_file, "wb") as f:
        pickle.dump(meta, f)
    return root


@pytest.fixture
def no_md5_check(monkeypatch):
    """torchvision checks the real archives' MD5 sums; generated files in their layout are not those."""
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: True)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("split", ["test", "train"])
def test_cifar_equals_clip_benchmark(tmp_path, tiny_model_dir, no_md5_check, name, split):
    root = write_cifar(tmp_path / "data", name)
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}", device="cpu")
    model.eval()
    ds = build_dataset(dataset_name=name, root=str(root), transform=transform, split=split, download=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False, num_workers=0)
    theirs = zeroshot_classification.evaluate(model, loader, open_clip.get_tokenizer(f"local-dir:{tiny_model_dir}"),
                                              ds.classes, ds.templates, "cpu", amp=False)
    ours_ds = open_dataset(name, str(root), split, None)
    assert ours_ds.prompts.classnames == ds.classes and ours_ds.prompts.templates == ds.templates
    assert ours_ds.labels.tolist() == list(ds.targets)
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    scored = evaluate_one("zeroshot_classification", session, DataSource(name, str(root), split), EmbeddingStore(
        tmp_path / "cache"), memo, encode=EncodeSettings(16, 2), score=ScoreSettings(batch_size=16))
    for key, value in theirs.items():
        if isinstance(value, float) and np.isnan(value):
            assert np.isnan(scored.metrics[key])
        else:
            assert scored.metrics[key] == value, key


def test_missing_and_damaged_cifar_files_are_named(tmp_path):
    with pytest.raises(DatasetError, match=r"cifar-10-batches-py/batches.meta not found \(clip_benchmark gets it "
                                           r"through torchvision from https://www.cs.toronto.edu"):
        open_dataset("cifar10", str(tmp_path), "test", None)
    root = write_cifar(tmp_path / "data")
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match="test_batch is not a CIFAR pickle"):
        open_dataset("cifar10", str(root), "test", None)
    with pytest.raises(DatasetError, match=r"has the splits train, test \(asked for .val.\)"):
        open_dataset("cifar10", str(root), "val", None)
    with pytest.raises(DatasetError, match="needs --dataset_root"):
        open_dataset("cifar10", None, "test", None)


def test_limit_reads_the_first_images_in_file_order(tmp_path):
    root = write_cifar(tmp_path / "data")
    full, first = open_dataset("cifar10", str(root), "train", None), open_dataset("cifar10", str(root), "train", 7)
    assert len(first) == 7 and np.array_equal(first.pixels, full.pixels[:7])


def write_imagenet(root, per_class=1):
    """torchvision's ImageNet layout: meta.bin beside val/<wnid>/, every one of the 1,000 class folders non-empty
    (as torchvision requires); shapes images, one per class."""
    from clipcache.tasks.datasets import shapes
    from clipcache.tasks.datasets.clip_benchmark.original import imagenet_wnids

    wnids = imagenet_wnids()
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 1200)
    for c, wnid in enumerate(wnids):
        (root / "val" / wnid).mkdir(parents=True)
        for j in range(per_class):
            ds.load_image((c * per_class + j) % len(ds)).resize((32, 32)).save(
                root / "val" / wnid / f"ILSVRC2012_val_{c:05d}{j}.JPEG", format="JPEG", quality=90)
    torch.save(({w: (f"class {i}",) for i, w in enumerate(wnids)}, []), root / "meta.bin")
    return root


@pytest.mark.slow  # 1,000 class folders, encoded by both tools
def test_imagenet_folder_equals_clip_benchmark(tmp_path, tiny_model_dir):
    """Both score with the first two of the 80 ImageNet templates (both tools' own lists are checked equal): 2,000
    prompts instead of 80,000 keep this test to seconds."""
    root = write_imagenet(tmp_path / "imagenet")
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}", device="cpu")
    model.eval()
    ds = build_dataset(dataset_name="imagenet1k", root=str(root), transform=transform, split="test", download=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=False, num_workers=0)
    theirs = zeroshot_classification.evaluate(model, loader, open_clip.get_tokenizer(f"local-dir:{tiny_model_dir}"),
                                              ds.classes, ds.templates[:2], "cpu", amp=False)
    ours_ds = open_dataset("imagenet1k", str(root), "test", None)
    assert ours_ds.prompts.classnames == ds.classes and ours_ds.prompts.templates == ds.templates
    assert ours_ds.labels.tolist() == list(ds.targets)
    assert [p.name for p in ours_ds.paths] == [p.rsplit("/", 1)[-1] for p, _ in ds.samples]
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    (tmp_path / "two.txt").write_text("\n".join(ds.templates[:2]) + "\n")
    scored = evaluate_one("zeroshot_classification", session, DataSource("imagenet1k", str(root)),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(64, 2),
                          score=ScoreSettings(batch_size=64), prompts=PromptSettings(templates=str(tmp_path / "two.txt")))
    assert scored.metrics == theirs


def test_a_plain_val_folder_with_some_classes_keeps_the_1000_class_indices(tmp_path):
    from clipcache.tasks.datasets.clip_benchmark.original import imagenet_wnids

    wnids = imagenet_wnids()
    for wnid in (wnids[3], wnids[998]):
        (tmp_path / "val" / wnid).mkdir(parents=True)
        from PIL import Image

        Image.new("RGB", (8, 8)).save(tmp_path / "val" / wnid / "a.png")
    ds = open_dataset("imagenet1k", str(tmp_path), "test", None)
    assert ds.labels.tolist() == [3, 998] and len(ds.prompts.classnames) == 1000
    (tmp_path / "val" / "n99999999").mkdir()
    with pytest.raises(DatasetError, match="n99999999 is not an ImageNet-1k WordNet id folder"):
        open_dataset("imagenet1k", str(tmp_path), "test", None)


def write_flickr(root, name="flickr30k", n=24):
    """Images + clip_benchmark's Karpathy caption file (and a _zh one): 1-3 shapes captions per image, some
    containing commas, repeated across images as real captions are."""
    from clipcache.tasks.datasets import shapes

    ds = shapes.load_shapes("fixture", "zeroshot_retrieval", "test", n)
    root.mkdir(parents=True)
    en, zh = ["image,caption"], ["image,caption"]
    for i in range(n):
        ds.load_image(i).save(root / f"{1000 + i}.jpg", quality=95)
        for j, caption in enumerate(ds.captions[i]):
            en.append(f"{1000 + i}.jpg,{caption}" + (", seen from afar" if j == 1 else ""))
            zh.append(f"{1000 + i}.jpg,图片 {caption}")
    (root / f"{name}_test_karpathy.txt").write_text("\n".join(en) + "\n")
    (root / f"{name}_test_zh.txt").write_text("\n".join(zh) + "\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("name, language", [("flickr30k", "en"), ("flickr8k", "zh")])
def test_flickr_karpathy_files_equal_clip_benchmark(tmp_path, tiny_model_dir, name, language):
    from clip_benchmark.datasets.builder import get_dataset_collate_fn
    from clip_benchmark.metrics import zeroshot_retrieval

    root = write_flickr(tmp_path / name, name)
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}", device="cpu")
    model.eval()
    ds = build_dataset(dataset_name=name, root=str(root), transform=transform, split="test", download=False,
                       task="zeroshot_retrieval", language=language)
    loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False, num_workers=0,
                                         collate_fn=get_dataset_collate_fn(name))
    theirs = zeroshot_retrieval.evaluate(model, loader, open_clip.get_tokenizer(f"local-dir:{tiny_model_dir}"),
                                         "cpu", amp=False, recall_k_list=[1, 5, 10])
    ours_ds = open_dataset(name, str(root), "test", None, language=language)
    assert ours_ds.captions == [c for _, c in ds.data] and set(ours_ds.languages) == {"en", "zh"}
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    scored = evaluate_one("zeroshot_retrieval", session, DataSource(name, str(root), language=language),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(16, 2),
                          score=ScoreSettings(recall_k=(1, 5, 10), batch_size=16),
                          prompts=PromptSettings(language=language))
    assert scored.metrics == theirs


def test_flickr_missing_files_are_named(tmp_path):
    root = write_flickr(tmp_path / "flickr30k")
    with pytest.raises(DatasetError, match=r"flickr30k_val_karpathy.txt not found \(clip_benchmark downloads it "
                                           r"from https://github.com/mehdidc/retrieval_annotations"):
        open_dataset("flickr30k", str(root), "val", None)
    (root / "1003.jpg").unlink()
    with pytest.raises(DatasetError, match=r"image .*1003.jpg \(named in flickr30k_test_karpathy.txt\) not found"):
        open_dataset("flickr30k", str(root), "test", None)
    with pytest.raises(DatasetError, match="language: 'fr' is not available"):
        open_dataset("flickr30k", str(root), "test", None, language="fr")


@pytest.mark.parametrize("language", ["de", "ja"])
def test_babel_imagenet_equals_clip_benchmark(tmp_path, language):
    """Babel-ImageNet on torchvision's ImageNet layout: the same images, labels (positions in the language's class
    list), class names and templates as clip_benchmark's BabelImageNet."""
    root = write_imagenet(tmp_path / "imagenet")
    ds = build_dataset(dataset_name="babel_imagenet", root=str(root), transform=None, split="test", download=False,
                       language=language)
    ours = open_dataset("babel_imagenet", str(root), "test", None, language=language)
    assert ours.prompts.classnames == ds.classes and ours.prompts.templates == ds.templates
    assert ours.prompts.language == language and len(ours) == len(ds)
    assert [p.name for p in ours.paths] == [p.rsplit("/", 1)[-1] for p, _ in ds.samples]
    assert ours.labels.tolist() == [ds[i][1] for i in range(len(ds))]
    with pytest.raises(DatasetError, match=r"language: 'xx' is not available for dataset 'babel_imagenet'"):
        open_dataset("babel_imagenet", str(root), "test", None, language="xx")
