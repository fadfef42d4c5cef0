"""Norms for the last two paths that lacked them: ``api:`` models (a local OpenAI-compatible server on 127.0.0.1
answering the tiny model's raw, non-unit features, images scaled far above texts) and the ``mieb:`` image pool. Their
entries keep each row's norm, so the image + text fusion of composed_retrieval and multiple_choice sums raw vectors
as mteb's CLIP-style wrappers do: scores equal a brute-force sum of the server's vectors, and mteb's own evaluator
fed raw vectors. An entry without norms is still read (normalised fusion, one warning)."""

from __future__ import annotations

import logging
import sys

import datasets
import numpy as np
import pytest
import torch
from test_composed_retrieval import session as local_session
from test_composed_retrieval import write_cirr
from test_multiple_choice import write_questions

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.mieb.composed_layouts import open_composed
from clipcache.tasks.datasets.mieb.mieb_layouts import open_multiple_choice
from clipcache.tasks.encode.mteb_encoder import CachedMtebEncoder, UncachedMtebEncoder, image_pool_fields, model_meta
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.api_model import normalised_and_norms
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from fake_embedding_server import FakeEmbeddingServer, load_tiny_model  # noqa: E402

IMAGE_SCALE, TEXT_SCALE = 6.0, 0.5  # image norms ~12x the texts': a normalised sum weighs the sides otherwise


class RawFeatures:
    """The tiny model answering its raw features (normalised row x norm), scaled per modality: an API model whose
    vectors are not unit length and whose image and text norms differ widely."""

    def __init__(self, model):
        self.model = model

    def image_transform(self, image):
        return self.model.image_transform(image)

    def encode_images(self, pixels):
        rows, norms = self.model.encode_images_with_norms(pixels)
        return rows * norms[:, None] * IMAGE_SCALE

    def encode_texts(self, texts):
        rows, norms = self.model.encode_texts_with_norms(texts)
        return rows * norms[:, None] * TEXT_SCALE


@pytest.fixture(scope="module")
def raw_server():
    raw = RawFeatures(load_tiny_model())
    with FakeEmbeddingServer(model=raw) as server:
        yield server, raw


def api_session(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-raw-norms")
    spec = ModelSpec(model_name="api:tiny-shapes-clip", api_base=server.api_base)
    return ModelSession(resolve_model(spec, FileHashMemo(None)), torch.device("cpu"), amp=False, precision="fp32")


def entries(store):
    return {store.open(k).attrs["key_fields"]["role"]: store.open(k) for k in store.keys()}


def cosine(a, b):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return a @ b.T


def test_api_answers_keep_their_norms():
    answered = np.array([[3.0, 4.0], [0.6, 0.8], [1e-3, 0.0]], np.float32)
    rows, norms = normalised_and_norms(answered)
    np.testing.assert_allclose(norms, [5.0, 1.0, 1e-3], rtol=1e-6)
    assert rows[1].tobytes() == answered[1].tobytes()  # a unit row keeps the server's bits
    np.testing.assert_allclose(rows * norms[:, None], answered, rtol=1e-6)


def test_api_model_composed_queries_sum_the_raw_vectors(raw_server, tmp_path, monkeypatch):
    server, raw = raw_server
    cirr = write_cirr(tmp_path / "cirr")
    store = EmbeddingStore(tmp_path / "cache")
    model_session = api_session(server, monkeypatch)
    try:
        scored = evaluate_one("composed_retrieval", model_session, DataSource("shapes_cirr", str(cirr), split="val"),
                              store, FileHashMemo(None), encode=EncodeSettings(8, 0))
    finally:
        model_session.close(report=False)
    data = open_composed("shapes_cirr", cirr, "val", None)
    found = entries(store)
    images = np.stack([raw.encode_images(torch.stack([raw.image_transform(data.images.load_image(i))]))[0]
                       for i in range(len(data.images))])
    texts = raw.encode_texts(data.texts)
    # the entries keep the server's norms: raw vectors come back as row x norm
    assert found["composed_image"].has_norms and found["modifier_text"].has_norms
    np.testing.assert_allclose(found["composed_image"].norms("test"), np.linalg.norm(images, axis=1), rtol=1e-5)
    np.testing.assert_allclose(found["modifier_text"].raw_embeddings("test"), texts, rtol=1e-5, atol=1e-5)
    # brute force: every query's target ranked by cosine with the sum of the raw vectors, the reference excluded
    gallery = images[data.gallery]

    def ranks(fused):
        out = []
        for q in range(len(data.targets)):
            s = cosine(fused[q], gallery)
            s[data.reference[q]] = -np.inf
            out.append(int((s > s[data.targets[q][0]]).sum()) + 1)
        return np.array(out)

    fused = images[data.query_image] + texts[data.query_text]
    expected = ranks(fused)
    assert scored.evidence.columns["rank"].tolist() == expected.tolist()
    for k in (1, 5, 10):
        assert scored.metrics[f"recall@{k}"] == np.mean(expected <= k)
    np.testing.assert_allclose(scored.evidence.columns["score"],
                               [cosine(fused[q], gallery[t])[0] for q, t in enumerate(data.targets)], atol=1e-5)
    # summing normalised vectors ranks otherwise here: the test sees the difference
    unit = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in (images, texts)]
    assert ranks(unit[0][data.query_image] + unit[1][data.query_text]).tolist() != expected.tolist()


def test_api_model_multiple_choice_equals_mteb_fusion(raw_server, tmp_path, monkeypatch):
    server, raw = raw_server
    root = write_questions(tmp_path / "mc")
    store = EmbeddingStore(tmp_path / "cache")
    model_session = api_session(server, monkeypatch)
    try:
        scored = evaluate_one("multiple_choice", model_session, DataSource("shapes_qa", str(root)), store,
                              FileHashMemo(None), encode=EncodeSettings(8, 0))
    finally:
        model_session.close(report=False)
    data = open_multiple_choice("shapes_qa", root, "test", None)
    assert all(e.has_norms for e in entries(store).values())
    images = np.stack([raw.encode_images(torch.stack([raw.image_transform(data.images.load_image(i))]))[0]
                       for i in range(len(data.images))])
    questions, choices = raw.encode_texts(data.questions), raw.encode_texts(data.choices)

    def similarities(image, question):
        fused = image[data.question_image] + question[data.question_text]
        return [cosine(fused[q], choices[rows]) for q, rows in enumerate(data.question_choices)]

    expected = similarities(images, questions)
    rows = scored.evidence.columns
    # each answer given is a best choice of the raw sum (equal texts tie; pytrec_eval's order picks among them)
    assert all(s[p] >= s.max() - 1e-5 for s, p in zip(expected, rows["prediction"], strict=True))
    np.testing.assert_allclose(rows["score"], [cosine(images[data.question_image[q]] + questions[data.question_text[q]],
                                                      choices[data.question_choices[q][p]])
                                               for q, p in enumerate(rows["prediction"])], atol=1e-5)
    unit = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in (images, questions)]
    # a normalised sum answers otherwise: the norms matter here
    assert any(s[p] < s.max() - 1e-3 for s, p in zip(similarities(*unit), rows["prediction"], strict=True))


def test_an_entry_without_norms_fuses_normalised_rows_with_a_warning(tmp_path, caplog):
    model_session, memo = local_session()
    cirr = write_cirr(tmp_path / "cirr")
    store = EmbeddingStore(tmp_path / "cache")
    source = DataSource("shapes_cirr", str(cirr), split="val")
    with_norms = evaluate_one("composed_retrieval", model_session, source, store, memo, encode=EncodeSettings(8, 0))
    text = entries(store)["modifier_text"]
    (text.path / "norms").rename(tmp_path / "norms")  # as an entry written before norms were kept
    store = EmbeddingStore(tmp_path / "cache")
    assert not entries(store)["modifier_text"].has_norms
    with caplog.at_level(logging.WARNING, logger="clipcache.evaluation"):
        old = evaluate_one("composed_retrieval", model_session, source, store, memo, encode=EncodeSettings(8, 0))
    assert "keeps no norms" in caplog.text and "clipcache cache rm" in caplog.text
    data = open_composed("shapes_cirr", cirr, "val", None)
    image = entries(store)["composed_image"].embeddings()
    fused = image[data.query_image] + entries(store)["modifier_text"].embeddings()[data.query_text]
    np.testing.assert_allclose(old.evidence.columns["score"],
                               [cosine(fused[q], image[data.gallery][t])[0] for q, t in enumerate(data.targets)],
                               atol=1e-5)
    assert not np.allclose(old.evidence.columns["score"], with_norms.evidence.columns["score"])


# -- the mieb: image pool ---------------------------------------------------------------------------------------------
class Meta:
    name = "NormsProbe"


def loader(columns):
    ds = datasets.Dataset.from_dict(columns)
    return torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=lambda rows: {k: [r[k] for r in rows]
                                                                                  for k in rows[0]})


def test_the_mieb_pool_keeps_the_models_norms_and_mteb_gets_raw_vectors(tmp_path, caplog):
    from clipcache.storage.content_pool import ContentPool
    from clipcache.storage.hashing import digest
    from clipcache.tasks.datasets import shapes

    model_session, _ = local_session()
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", 7)
    images = [ds.load_image(i).convert("RGB") for i in range(7)]
    texts = [f"a photo of a {shapes.CLASSNAMES[int(x)]}." for x in ds.labels]
    store = EmbeddingStore(tmp_path / "cache")
    encoder = CachedMtebEncoder(model_session, store, batch_size=3)
    model = model_session.model
    rows, norms = model.encode_images_with_norms(torch.stack([model.image_transform(i) for i in images]))
    text_rows, text_norms = model.encode_texts_with_norms(texts)
    kw = {"task_metadata": Meta, "hf_split": "test", "hf_subset": "default"}
    got = encoder.encode(loader({"image": images}), **kw)
    pool = ContentPool(store, digest(image_pool_fields(model_session)))
    [batch] = [store.open(k) for k in pool.batch_keys()]
    assert batch.has_norms
    np.testing.assert_allclose(batch.norms("test"), norms, rtol=1e-5)  # the model's raw norms
    np.testing.assert_allclose(got, rows * norms[:, None], rtol=1e-5, atol=1e-5)  # mteb gets raw features
    got = encoder.encode(loader({"text": texts}), **kw)  # texts: the text pool's entries keep norms too
    np.testing.assert_allclose(got, text_rows * text_norms[:, None], rtol=1e-5, atol=1e-5)
    # image + text inputs: the sum of the raw vectors, as mteb's CLIP-style wrappers return; read from the cache
    again = CachedMtebEncoder(model_session, store, batch_size=3, cached_only=True)
    fused = again.encode(loader({"image": images, "text": texts}), **kw)
    np.testing.assert_allclose(fused, rows * norms[:, None] + text_rows * text_norms[:, None], rtol=1e-5, atol=1e-5)
    uncached = UncachedMtebEncoder(model, model_meta("x", "y")).encode(loader({"image": images, "text": texts}), **kw)
    np.testing.assert_allclose(fused, uncached, atol=1e-5)
    # a pool batch of the previous release (norms, no raw rows): raw features rebuilt as row x norm, one warning
    assert batch.has_raw
    (batch.path / "raw").rename(tmp_path / "raw")
    rebuilt = CachedMtebEncoder(model_session, EmbeddingStore(tmp_path / "cache"), batch_size=3, cached_only=True)
    with caplog.at_level(logging.WARNING, logger="clipcache.mieb"):
        again_fused = rebuilt.encode(loader({"image": images, "text": texts}), **kw)
    assert "without raw rows (cache entries of an earlier release" in caplog.text
    np.testing.assert_allclose(again_fused, fused, rtol=1e-5, atol=1e-5)
    caplog.clear()
    # a pool batch written before norms were kept: still read, normalised vectors and one warning
    (batch.path / "norms").rename(tmp_path / "norms")
    old = CachedMtebEncoder(model_session, EmbeddingStore(tmp_path / "cache"), batch_size=3, cached_only=True)
    with caplog.at_level(logging.WARNING, logger="clipcache.mieb"):
        plain = old.encode(loader({"image": images, "text": texts}), **kw)
    assert "without norms" in caplog.text and "image vectors" in caplog.text
    np.testing.assert_allclose(plain, rows + text_rows, atol=1e-5)
