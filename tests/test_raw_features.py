"""Each cached row keeps its L2 norm before normalisation (``norms``), so raw features are normalised row x norm:
the norms are the model's own, written and sealed with the rows, survive an interrupted encode (a SIGKILLed one:
tests/test_cache.py's kill test compares every array and seal with an uninterrupted run), and leave the normalised rows' bits as they were; an entry without norms stays readable and refuses raw features in one
line; visual STS's distances on raw features equal mteb's evaluator on them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clipcache.storage.cache_keys import AuxSpec
from clipcache.storage.embedding_store import EmbeddingStore, entry_key
from clipcache.storage.errors import CacheIntegrityError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.shapes import load_shapes
from clipcache.tasks.encode.stage import ModelSession, encode_images, encode_texts, image_key_fields
from clipcache.tasks.evaluation.base import EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.progress import StageProgress

FIELDS = {"role": "image", "model": "norms-test", "dataset": {"n": 1}, "split": "test", "limit": None}
CHUNK_ROWS = 64


@pytest.fixture(scope="module")
def session():
    memo = FileHashMemo(None)
    return ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                        amp=False, precision="fp32")


def write(store, data, norms, batch=50, fail_after=None):
    positions = np.arange(len(data))
    with store.writer(FIELDS, "image", capacity=len(data), aux={"target": AuxSpec("int64")}) as w:
        for lo in range(int(w.start_position), len(data), batch):
            if fail_after is not None and lo >= fail_after:
                raise KeyboardInterrupt("simulated crash")
            w.add(data[lo:lo + batch], positions[lo:lo + batch], norms=None if norms is None else norms[lo:lo + batch],
                  target=positions[lo:lo + batch] % 3)
        return w.finish(), w


def unit_rows(n, dim=8, seed=0):
    raw = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32) * 3
    norms = np.linalg.norm(raw, axis=1).astype(np.float32)
    return (raw / norms[:, None]).astype(np.float32), norms


# -- the store ----------------------------------------------------------------------------------------------------
def test_norms_are_sealed_with_the_rows_and_resume_after_an_interruption(tmp_path):
    data, norms = unit_rows(3 * CHUNK_ROWS + 11)
    store = EmbeddingStore(tmp_path / "killed", chunk_rows=CHUNK_ROWS)
    with pytest.raises(KeyboardInterrupt):
        write(store, data, norms, fail_after=150)
    progress = json.loads((store.partial_path(entry_key(FIELDS)) / "progress.json").read_text())
    assert progress["rows"] == 2 * CHUNK_ROWS and len(progress["seals"]["norms"]) == 2
    ref, writer = write(store, data, norms)
    assert writer.resumed
    entry = store.open(ref.key)
    assert entry.has_norms and entry.array("norms").dtype == np.float32
    np.testing.assert_array_equal(entry.norms("test"), norms)
    np.testing.assert_array_equal(entry.raw_embeddings("test"), data * norms[:, None])
    clean = EmbeddingStore(tmp_path / "clean", chunk_rows=CHUNK_ROWS)
    clean_ref, _ = write(clean, data, norms)
    assert entry.attrs["chunk_seals"] == clean.open(clean_ref.key).attrs["chunk_seals"]
    # a changed byte in the norms is found like one in the rows
    import zarr

    zarr.open_array(str(store.entry_path(ref.key) / "norms"), mode="r+")[CHUNK_ROWS + 1] = 7.0
    assert any("'norms'" in problem for problem in store.verify(ref.key))


def test_an_entry_without_norms_is_readable_and_refuses_raw_features_in_one_line(tmp_path):
    data, _ = unit_rows(10)
    store = EmbeddingStore(tmp_path)
    ref, _ = write(store, data, None)
    entry = store.open(ref.key)
    np.testing.assert_array_equal(entry.embeddings(), data)
    assert not entry.has_norms and "norms" not in entry.array_names()
    with pytest.raises(CacheIntegrityError) as e:
        entry.raw_embeddings("mieb_linear_probe")
    message = str(e.value)
    assert len(message.splitlines()) == 1 and "keeps no norms" in message and "mieb_linear_probe" in message
    assert f"clipcache cache rm --cache_dir {tmp_path} {ref.key[:12]}" in message


def test_rows_without_norms_cannot_join_an_entry_that_keeps_them(tmp_path):
    data, norms = unit_rows(4)
    store = EmbeddingStore(tmp_path)
    with store.writer(FIELDS, "image", capacity=4, aux={"target": AuxSpec("int64")}) as w:
        w.add(data[:2], np.arange(2), norms=norms[:2], target=np.zeros(2, np.int64))
        with pytest.raises(ValueError, match="keeps each row's norm"):
            w.add(data[2:], np.arange(2, 4), target=np.zeros(2, np.int64))
        with pytest.raises(ValueError, match="expected 2 norms"):
            w.add(data[2:], np.arange(2, 4), norms=norms[:1], target=np.zeros(2, np.int64))


# -- the encode stage ---------------------------------------------------------------------------------------------
def test_encoded_norms_are_the_models_raw_features_and_the_rows_keep_their_bits(tmp_path, session):
    ds = load_shapes("shapes", "zeroshot_classification", "test", None, size=24)
    store = EmbeddingStore(tmp_path)
    out = encode_images(session, ds, store, image_key_fields(session, ds.identity(FileHashMemo(None)), "test", None),
                        EncodeSettings(10, 0, "error"), StageProgress(enabled=False))
    entry = store.open(out.ref.key)
    model = session.model
    pixels = torch.stack([model.image_transform(ds.load_image(i)) for i in range(len(ds))])
    with torch.inference_mode():
        raw = torch.cat([model._encode_image(pixels[lo:lo + 10]) for lo in range(0, 24, 10)]).float()
        # the normalised rows: clip_benchmark's F.normalize on the same batches, bit for bit as before norms
        expected = torch.cat([F.normalize(model._encode_image(pixels[lo:lo + 10]), dim=-1)
                              for lo in range(0, 24, 10)]).float().numpy()
    np.testing.assert_array_equal(entry.embeddings(), expected)
    np.testing.assert_allclose(entry.norms("test"), torch.linalg.vector_norm(raw, dim=-1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(entry.raw_embeddings("test"), raw.numpy(), rtol=1e-5, atol=1e-6)
    assert 1 < float(entry.norms("test").min())  # the tiny model's features are far from unit length

    texts = ["a red circle", "a blue square", "a green cross"]
    text_out = encode_texts(session, texts, store, {"role": "caption", "t": 1}, kind="caption", batch_size=2,
                            progress=StageProgress(enabled=False), label="texts")
    text_entry = store.open(text_out.ref.key)
    with torch.inference_mode():
        raw_text = model._encode_text(model.tokenize(texts)).float()
    np.testing.assert_allclose(text_entry.raw_embeddings("test"), raw_text.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(text_entry.embeddings(), model.encode_texts(texts[:2]).tolist()
                                  + model.encode_texts(texts[2:]).tolist())



def test_entries_of_tasks_that_hand_raw_features_on_keep_the_models_output_bit_for_bit(tmp_path, session):
    """``raw=True`` (visual STS, multiple choice, composed retrieval, MIEB's probe, the mteb encoder's pools): the
    entry keeps the raw rows, equal to the model's output on the same batches to the last bit (row x norm is not),
    and the normalised rows keep their bits; an interrupted encode resumes with them; without ``raw``, none."""
    ds = load_shapes("shapes", "zeroshot_classification", "test", None, size=24)
    model = session.model
    pixels = torch.stack([model.image_transform(ds.load_image(i)) for i in range(len(ds))])
    with torch.inference_mode():
        raw = torch.cat([model._encode_image(pixels[lo:lo + 10]) for lo in range(0, 24, 10)]).float().numpy()
    fields = image_key_fields(session, ds.identity(FileHashMemo(None)), "test", None)
    settings = EncodeSettings(10, 0, "error")
    store = EmbeddingStore(tmp_path / "raw", chunk_rows=CHUNK_ROWS)
    entry = store.open(encode_images(session, ds, store, fields, settings, StageProgress(enabled=False),
                                     raw=True).ref.key)
    assert entry.has_raw and "raw" in entry.array_names() and not entry.verify()
    np.testing.assert_array_equal(entry.raw_embeddings("test"), raw)
    assert not np.array_equal(entry.embeddings() * entry.norms("test")[:, None], raw)
    plain = EmbeddingStore(tmp_path / "plain", chunk_rows=CHUNK_ROWS)
    other = plain.open(encode_images(session, ds, plain, fields, settings, StageProgress(enabled=False)).ref.key)
    assert not other.has_raw
    np.testing.assert_array_equal(other.embeddings(), entry.embeddings())
    np.testing.assert_array_equal(other.norms("test"), entry.norms("test"))

    data, norms = unit_rows(3 * CHUNK_ROWS + 11)  # the writer: raw rows sealed, committed and resumed with the rows
    raw_rows = data * norms[:, None] + np.float32(1e-3)
    killed = EmbeddingStore(tmp_path / "killed", chunk_rows=CHUNK_ROWS)
    positions = np.arange(len(data))

    def write(fail_after=None):
        with killed.writer(FIELDS, "image", capacity=len(data), aux={}) as w:
            for lo in range(int(w.start_position), len(data), 50):
                if fail_after is not None and lo >= fail_after:
                    raise KeyboardInterrupt("simulated crash")
                w.add(data[lo:lo + 50], positions[lo:lo + 50], norms=norms[lo:lo + 50], raw=raw_rows[lo:lo + 50])
            return w.finish()

    with pytest.raises(KeyboardInterrupt):
        write(fail_after=150)
    resumed = killed.open(write().key)
    assert not resumed.verify()
    np.testing.assert_array_equal(resumed.raw_embeddings("test"), raw_rows)
    with pytest.raises(ValueError, match="raw rows are kept with their norms"):
        with EmbeddingStore(tmp_path / "bad").writer(FIELDS, "image", capacity=2, aux={}) as w:
            w.add(data[:2], positions[:2], raw=raw_rows[:2])
