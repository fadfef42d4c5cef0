"""Dataset formats and their bad-input messages."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
import torch

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import format_root, open_dataset
from clipcache.tasks.datasets.shapes import CLASSNAMES, load_shapes
from clipcache.tasks.encode.stage import iter_image_batches

from conftest import replace_tar_member, write_image_queries, write_wds


def test_webdataset_classification_in_shard_order(wds_classification):
    ds = open_dataset("wds/shapes_cls", str(wds_classification), "test", None)
    ref = load_shapes("x", "zeroshot_classification", "test", 90)
    assert len(ds) == 90 and ds.task == "zeroshot_classification" and not ds.multilabel
    np.testing.assert_array_equal(ds.labels, ref.labels)
    assert ds.prompts.classnames == CLASSNAMES and "{c}" in ds.prompts.templates[0]
    # webp is lossless: the decoded image equals the generated one
    assert np.array_equal(np.asarray(ds.load_image(47)), np.asarray(ref.load_image(47)))


def test_webdataset_retrieval_and_multilabel(wds_retrieval, wds_multilabel):
    ret = open_dataset("wds/shapes_ret", str(wds_retrieval), "test", None)
    ref = load_shapes("x", "zeroshot_retrieval", "test", 60)
    assert ret.task == "zeroshot_retrieval" and ret.captions == ref.captions
    assert any(len(c) > 1 for c in ret.captions)
    ml = open_dataset("wds/shapes_ml", str(wds_multilabel), "test", None)
    assert ml.multilabel and ml.labels.shape == (40, 30) and ml.labels.dtype == np.uint8
    assert ml.load_image(0).mode == "RGB"


def test_limit_is_exactly_the_first_n_samples(wds_classification):
    ds = open_dataset("wds/shapes_cls", str(wds_classification), "test", 31)
    full = open_dataset("wds/shapes_cls", str(wds_classification), "test", None)
    assert len(ds) == 31
    np.testing.assert_array_equal(ds.labels, full.labels[:31])
    assert len(ds.shards_used()) == 2  # 30 per shard: the third shard is not even read


def test_more_workers_than_shards_keeps_order(wds_classification):
    ds = open_dataset("wds/shapes_cls", str(wds_classification), "test", 50)
    to_tensor = lambda img: torch.from_numpy(np.asarray(img).copy())  # noqa: E731
    for workers in (0, 1, 5):
        batches = list(iter_image_batches(ds, to_tensor, start=3, batch_size=7, num_workers=workers))
        assert [e for b in batches for e in b.errors] == []
        assert np.concatenate([b.indices for b in batches]).tolist() == list(range(3, 50))
        assert batches[0].pixels.shape == (7, 64, 64, 3)


def test_dataset_root_template(tmp_path):
    assert format_root(str(tmp_path / "{dataset_cleaned}"), "vtab/cifar10") == tmp_path / "vtab-cifar10"
    assert format_root(str(tmp_path / "{dataset}"), "cars") == tmp_path / "cars"


def test_missing_split_names_the_existing_ones(wds_classification):
    with pytest.raises(DatasetError, match=r"nshards.txt is missing \(available splits: test\)"):
        open_dataset("wds/shapes_cls", str(wds_classification), "valid", None)


def test_missing_directory_and_shard(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        open_dataset("wds/nope", str(tmp_path / "nope"), "test", None)
    root = write_wds(tmp_path / "d", "classification", 10, shards=2)
    (root / "test" / "1.tar").unlink()
    with pytest.raises(DatasetError, match=r"shard .*1\.tar is missing"):
        open_dataset("wds/d", str(root), "test", None)


def test_corrupt_image_and_corrupt_shard_are_named(tmp_path):
    root = write_wds(tmp_path / "d", "classification", 6, shards=1, fmt="png")
    shard = root / "test" / "0.tar"
    with tarfile.open(shard) as tar:
        truncated = tar.extractfile("s000002.png").read()[:40]
    replace_tar_member(shard, "s000002.png", truncated)
    ds = open_dataset("wds/d", str(root), "test", None)
    with pytest.raises(DatasetError, match=r"0\.tar member s000002\.png"):
        ds.load_image(2)
    shard.write_bytes(b"not a tar file at all" * 10)
    with pytest.raises(DatasetError, match=r"0\.tar is not a readable tar"):
        open_dataset("wds/d", str(root), "test", None)


def test_label_outside_classnames(tmp_path):
    root = write_wds(tmp_path / "d", "classification", 6, shards=1)
    (root / "classnames.txt").write_text("red circle\nred square\n")
    with pytest.raises(DatasetError, match="outside the 2 classes"):
        open_dataset("wds/d", str(root), "test", None)


def test_image_queries_jsonl_relative_to_file_and_cwd(tmp_path, monkeypatch):
    data_dir = write_image_queries(tmp_path / "a", n=5, relative_to="file")
    ds = open_dataset("custom", str(data_dir), "test", None)
    assert len(ds) == 5 and ds.task == "zeroshot_retrieval" and ds.load_image(4).size == (64, 64)
    # evalscope's own examples use paths relative to the working directory
    data_dir2 = tmp_path / "b"
    data_dir2.mkdir()
    lines = [json.dumps({"image_path": "a/images/img0.png", "query": "a single string query"})]
    (data_dir2 / "image_queries.jsonl").write_text("\n".join(lines))
    monkeypatch.chdir(tmp_path)
    ds2 = open_dataset("custom", str(data_dir2), "test", None)
    assert ds2.captions == [["a single string query"]]


def test_image_queries_bad_input(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(DatasetError, match="image_queries.jsonl not found"):
        open_dataset("custom", str(d), "test", None)
    (d / "image_queries.jsonl").write_text('{"image_path": "missing.jpg", "query": ["x"]}\n')
    with pytest.raises(DatasetError, match=r"line 1: image_path 'missing.jpg' not found"):
        open_dataset("custom", str(d), "test", None)
    (d / "image_queries.jsonl").write_text('{"image_path": "x.jpg", "query": ["x"]}\n{broken\n')
    with pytest.raises(DatasetError, match="line"):
        open_dataset("custom", str(d), "test", None)
    with pytest.raises(DatasetError, match="needs data_dir"):
        open_dataset("custom", None, "test", None)


def test_image_queries_encodings(tmp_path):
    """A byte-order mark and CRLF line ends (files saved on Windows) read fine; bytes that are not UTF-8 are one
    error naming the file and the line."""
    from PIL import Image

    d = tmp_path / "d"
    d.mkdir()
    Image.new("RGB", (8, 8), "red").save(d / "a b é.png")
    lines = ['{"image_path": "a b é.png", "query": ["a red square", "rouge"]}', '{"image_path": "a b é.png", '
             '"query": ["again"]}']
    (d / "image_queries.jsonl").write_bytes("\ufeff".encode() + "\r\n".join(lines).encode() + b"\r\n")
    ds = open_dataset("custom", str(d), "test", None)
    assert len(ds) == 2 and ds.captions[0] == ["a red square", "rouge"]
    latin1 = b'{"image_path": "a.png", "query": ["caf\xe9"]}\n'  # "cafe" with an accent, saved as Latin-1
    (d / "image_queries.jsonl").write_bytes(lines[0].encode() + b"\n" + latin1)
    with pytest.raises(DatasetError, match=r"image_queries.jsonl line 2: not UTF-8"):
        open_dataset("custom", str(d), "test", None)


def test_unknown_dataset_suggests_a_name():
    with pytest.raises(DatasetError, match="Did you mean: .*shapes"):
        open_dataset("shapez", None, "test", None)
    with pytest.raises(DatasetError, match="Did you mean: .*imagenet1k"):
        open_dataset("imagenet1", None, "test", None)
    with pytest.raises(DatasetError, match="needs --dataset_root"):
        open_dataset("cars", None, "test", None)


def test_shapes_is_deterministic_and_identity_is_content_based(tmp_path, wds_classification):
    a = load_shapes("shapes", "zeroshot_classification", "test", 20)
    b = load_shapes("shapes", "zeroshot_classification", "test", 20)
    assert np.array_equal(np.asarray(a.load_image(7)), np.asarray(b.load_image(7)))
    assert sorted(set(load_shapes("shapes", "zeroshot_classification", "test", None).labels)) == list(range(30))
    memo = FileHashMemo(tmp_path / "memo.json")
    ds = open_dataset("wds/shapes_cls", str(wds_classification), "test", None)
    first = ds.identity(memo)
    memo.save()
    again = open_dataset("wds/other_name", str(wds_classification), "test", None).identity(FileHashMemo(tmp_path /
                                                                                                        "memo.json"))
    assert first == again  # same bytes, same identity, whatever the name
    limited = open_dataset("wds/shapes_cls", str(wds_classification), "test", 10).identity(memo)
    assert limited != first  # fewer shards read


def test_empty_shards_and_all_bad_images_are_clear_errors(tmp_path):
    import tarfile as tf

    import torch as t

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.encode.stage import ModelSession, encode_images
    from clipcache.tasks.evaluation.base import EncodeSettings
    from clipcache.tasks.progress import StageProgress

    root = write_wds(tmp_path / "empty", "classification", 4, shards=1)
    with tf.open(root / "test" / "0.tar", "w"):
        pass
    with pytest.raises(DatasetError, match="has no samples"):
        open_dataset("wds/empty", str(root), "test", None)


    ds = load_shapes("x", "zeroshot_classification", "test", 3)
    ds.read_image_bytes = lambda i: b"not an image"  # every image fails to decode
    from clipcache.tasks.models.resolve import resolve_model
    from clipcache.tasks.models.spec import ModelSpec

    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), FileHashMemo(None)),
                           t.device("cpu"), False, "fp32")
    with pytest.raises(DatasetError, match="none of its 3 images could be decoded"):
        encode_images(session, ds, EmbeddingStore(tmp_path / "c"), {"k": 1}, EncodeSettings(2, 0, "skip"),
                      StageProgress(enabled=False))
