"""The Zarr embedding store: round trip, key verification, checksums, atomic publish and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from clipcache.storage.cache_entry import seal_attrs
from clipcache.storage.cache_keys import block_digest
from clipcache.storage.embedding_store import AuxSpec, EmbeddingStore, entry_key
from clipcache.storage.errors import CacheIntegrityError

CHUNK_ROWS = 256  # small chunks: several per test entry, and fast
FIELDS = {"role": "image", "model": {"name": "m"}, "dataset": {"content": "abc"}, "split": "test", "limit": None}


def write(store, fields, data, positions=None, batch=1000, fail_after=None, aux=None):
    positions = np.arange(len(data)) if positions is None else positions
    with store.writer(fields, "image", capacity=len(data), aux={"target": AuxSpec("int64")} if aux is not None else
                      None) as w:
        start = int(np.searchsorted(positions, w.start_position))
        for lo in range(start, len(data), batch):
            if fail_after is not None and lo >= fail_after:
                raise KeyboardInterrupt("simulated crash")
            extra = {"target": aux[lo:lo + batch]} if aux is not None else {}
            w.add(data[lo:lo + batch], positions[lo:lo + batch], **extra)
        return w.finish(meta={"note": "x"}), w


def test_round_trip_across_chunk_boundaries(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.random.default_rng(0).normal(size=(2 * CHUNK_ROWS + 123, 8)).astype(np.float32)
    targets = np.arange(len(data)) % 7
    ref, _ = write(store, FIELDS, data, aux=targets)
    entry = store.open(ref.key, FIELDS)
    np.testing.assert_array_equal(entry.embeddings(), data)
    np.testing.assert_array_equal(entry.array("target"), targets)
    np.testing.assert_array_equal(entry.array("position"), np.arange(len(data)))
    assert (entry.count, entry.dim, entry.meta) == (len(data), 8, {"note": "x"})
    assert {name: len(seals) for name, seals in entry.attrs["chunk_seals"].items()} == \
        {"embeddings": 3, "position": 3, "target": 3}
    assert ref.key == entry_key(FIELDS) and store.has(ref.key)


def test_every_key_field_changes_the_key():
    base = entry_key(FIELDS)
    for field, value in [("role", "caption"), ("model", {"name": "m2"}), ("dataset", {"content": "abd"}),
                         ("split", "train"), ("limit", 10)]:
        assert entry_key({**FIELDS, field: value}) != base
    assert entry_key(dict(reversed(list(FIELDS.items())))) == base  # order does not matter


def test_stored_key_is_verified_on_read(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    ref, _ = write(store, FIELDS, np.ones((10, 4), np.float32))
    with pytest.raises(CacheIntegrityError, match="different inputs"):
        store.open(ref.key, {**FIELDS, "split": "train"})
    # Tamper with the stored key fields: the digest no longer matches the entry name.
    group = zarr.open_group(str(store.entry_path(ref.key)), mode="r+")
    group.attrs["key_fields"] = {**FIELDS, "split": "other"}
    with pytest.raises(CacheIntegrityError, match="attributes in .*zarr.json were changed"):
        store.open(ref.key)
    group.attrs.update(seal_attrs(dict(group.attrs)))  # re-sealed: the key check still catches it
    with pytest.raises(CacheIntegrityError, match="stored key mismatch"):
        store.open(ref.key)


def test_corrupted_chunk_is_detected(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.random.default_rng(1).normal(size=(CHUNK_ROWS + 5, 4)).astype(np.float32)
    ref, _ = write(store, FIELDS, data)
    arr = zarr.open_array(str(store.entry_path(ref.key) / "embeddings"), mode="r+")
    arr[CHUNK_ROWS + 1, 2] = 42.0  # silently change one value in chunk 1
    with pytest.raises(CacheIntegrityError, match="embeddings/c/1/0"):
        store.open(ref.key).embeddings()


def test_seals_are_crc32c_and_entries_sealed_with_sha256_still_verify(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.random.default_rng(3).normal(size=(2 * CHUNK_ROWS + 7, 4)).astype(np.float32)
    ref, _ = write(store, FIELDS, data, aux=np.arange(len(data)) % 5)
    group = zarr.open_group(str(store.entry_path(ref.key)), mode="r+")
    seals = dict(group.attrs)["chunk_seals"]
    assert all(s.startswith("crc32c:") for values in seals.values() for s in values)
    # an entry of an earlier release: SHA-256 hex seals under the old attribute name
    legacy = {name: [block_digest(np.asarray(group[name][lo:lo + CHUNK_ROWS]), "sha256")
                     for lo in range(0, len(data), CHUNK_ROWS)] for name in seals}
    attrs = {k: v for k, v in dict(group.attrs).items() if k != "chunk_seals"}
    group.attrs.clear()
    group.attrs.update(seal_attrs({**attrs, "chunk_sha256": legacy}))
    assert store.verify(ref.key) == [] and store.has(ref.key)
    np.testing.assert_array_equal(store.open(ref.key).embeddings(), data)
    zarr.open_array(str(store.entry_path(ref.key) / "target"), mode="r+")[CHUNK_ROWS + 3] = 99
    assert any("target/c/1" in problem for problem in store.verify(ref.key))


def test_interrupted_write_is_invisible_then_resumes_bit_identical(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.random.default_rng(2).normal(size=(3 * CHUNK_ROWS + 10, 6)).astype(np.float32)
    with pytest.raises(KeyboardInterrupt):
        write(store, FIELDS, data, batch=100, fail_after=600)
    key = entry_key(FIELDS)
    assert not store.has(key) and store.partial_path(key).exists()
    with pytest.raises(CacheIntegrityError):
        store.open(key)
    progress = json.loads((store.partial_path(key) / "progress.json").read_text())
    assert progress["rows"] == 2 * CHUNK_ROWS and progress["next_position"] == 2 * CHUNK_ROWS
    ref, writer = write(store, FIELDS, data, batch=100)
    assert writer.resumed
    np.testing.assert_array_equal(store.open(ref.key).embeddings(), data)
    clean = EmbeddingStore(tmp_path / "clean", chunk_rows=CHUNK_ROWS)
    ref2, _ = write(clean, FIELDS, data)
    assert store.open(ref.key).attrs["chunk_seals"] == clean.open(ref2.key).attrs["chunk_seals"]


def test_skipped_positions_are_recorded(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.ones((5, 3), np.float32)
    positions = np.array([0, 1, 3, 4, 7])
    ref, _ = write(store, FIELDS, data, positions=positions)
    assert store.open(ref.key).array("position").tolist() == [0, 1, 3, 4, 7]


def test_an_entry_whose_metadata_was_deleted_is_encoded_again_in_its_place(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.random.default_rng(4).normal(size=(CHUNK_ROWS + 3, 4)).astype(np.float32)
    ref, _ = write(store, FIELDS, data)
    (store.entry_path(ref.key) / "zarr.json").unlink()
    assert not store.has(ref.key) and store.verify(ref.key)  # damaged, and said so
    again, writer = write(store, FIELDS, data)  # what `clipcache eval` then does: no "Directory not empty"
    assert not writer.already_complete and store.verify(again.key) == []
    np.testing.assert_array_equal(store.open(again.key).embeddings(), data)


def test_gc_never_deletes_what_a_running_encode_holds(tmp_path, capsys):
    """A writer holds its key's lock while it encodes: `cache gc --partial` (and any gc) leaves that entry alone
    instead of waiting or deleting it; once the writer is gone the partial entry is collected."""
    from clipcache.flows.cli import main

    store = EmbeddingStore(tmp_path, chunk_rows=CHUNK_ROWS)
    data = np.random.default_rng(5).normal(size=(3 * CHUNK_ROWS, 4)).astype(np.float32)
    writer = store.writer(FIELDS, "image", capacity=len(data))
    with writer:
        writer.add(data[:CHUNK_ROWS + 10], np.arange(CHUNK_ROWS + 10))
        writer._commit(everything=False)  # some committed progress, as a long encode has
        assert store.partial_keys() == [writer.key]
        assert main(["cache", "gc", "--partial", "--cache_dir", str(tmp_path)]) == 0
        assert "in use by a running encode" in capsys.readouterr().out
        assert store.partial_path(writer.key).exists()
        writer.add(data[CHUNK_ROWS + 10:], np.arange(CHUNK_ROWS + 10, len(data)))
        ref = writer.finish()
    np.testing.assert_array_equal(store.open(ref.key).embeddings(), data)  # the encode finished intact
    with store.writer({**FIELDS, "split": "other"}, "image", capacity=len(data)) as w:
        w.add(data[:CHUNK_ROWS + 1], np.arange(CHUNK_ROWS + 1))
        w._commit(everything=False)
    # ... the writer is gone (a killed run): now the partial entry is garbage, the complete one is kept
    assert main(["cache", "gc", "--partial", "--cache_dir", str(tmp_path)]) == 0
    assert store.partial_keys() == [] and store.has(ref.key)
