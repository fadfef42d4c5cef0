"""mteb's query / document roles (``prompt_type``, ``PromptType.query`` / ``PromptType.document``) reach the model:
with mteb's own evaluator on local copies of retrieval tasks, a task's query texts arrive as queries and its corpus as
documents. A local model embeds both alike, so its texts stay in the one text pool (earlier runs' keys unchanged); an
``api:`` model that sends roles (the Cohere format against the local embedding server, which puts Voyage's role
prompts before each text of a role) sends each text with its role, and scores what mteb gives a reference encoder
that puts the same prompts before each text of the role mteb names."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_mieb_parity import ASSET, assert_equal_scores, write_retrieval_copy

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.storage.text_pool import TextPool
from clipcache.tasks.encode.mteb_encoder import UncachedMtebEncoder, model_meta
from clipcache.tasks.encode.stage import ModelSession, prompt_pool_fields
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec

from conftest import REPO
from mieb_fixtures import BATCH, session

sys.path.insert(0, str(REPO / "scripts"))
from fake_embedding_server import ROLE_INSTRUCTIONS, FakeEmbeddingServer  # noqa: E402

# (task, query columns, corpus columns): texts on both sides, and image + text queries over images
TASKS = {"WebQAT2TRetrieval": (("text",), ("text",)), "CIRRIT2IRetrieval": (("image", "text"), ("image",))}
N = 12


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    base = tmp_path_factory.mktemp("roles")
    return {name: write_retrieval_copy(base / name, query, corpus, n=N) for name, (query, corpus) in TASKS.items()}


def query_texts(root: Path) -> set[str]:
    import pyarrow.parquet as pq

    return set(pq.read_table(next((root / "queries").glob("*.parquet"))).column("text").to_pylist())


class Recording(UncachedMtebEncoder):
    """The uncached encoder, remembering the role each text was embedded as."""

    def __init__(self, model):
        super().__init__(model, model_meta("clipcache/tiny-shapes-clip", "uncached"))
        self.seen: dict[str, set[str]] = {"query": set(), "document": set()}

    def _text_vectors(self, texts, task, role):
        self.seen[role].update(texts)
        return super()._text_vectors(texts, task, role)


@pytest.mark.parametrize("name", list(TASKS))
def test_mteb_hands_a_retrieval_tasks_queries_and_corpus_with_their_roles(name, copies):
    import mteb

    from clipcache.tasks.datasets.mieb.mieb_tasks import load_mieb

    model_session, _ = session()
    encoder = Recording(model_session.model)
    mteb.evaluate(encoder, load_mieb(name, copies[name], "test", "en").task, cache=None, co2_tracker=False,
                  show_progress_bar=False, encode_kwargs={"batch_size": BATCH})
    queries = query_texts(copies[name])
    assert len(queries) > 1 and encoder.seen["query"] == queries
    assert not encoder.seen["document"] & queries
    if "text" in TASKS[name][1]:
        assert encoder.seen["document"] and all(t.startswith("a photo of a ") for t in encoder.seen["document"])
    assert encoder.counts.by_prompt_type == {"query": N, "document": N}


def test_a_local_models_query_texts_stay_in_its_one_text_pool(copies, tmp_path):
    """A local model embeds a query as any text: mteb's queries go to the pool class prompts use, as before roles
    were passed (the keys of earlier runs' entries still answer), and no query pool is made."""
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    name = "WebQAT2TRetrieval"
    evaluate_one("mieb", model_session, DataSource(f"mieb:{name}", str(copies[name])), store, memo,
                 encode=EncodeSettings(BATCH, 0))
    assert not model_session.resolved.text_roles
    queries = sorted(query_texts(copies[name]))
    assert TextPool(store, digest(prompt_pool_fields(model_session))).missing(queries) == []
    assert TextPool(store, digest(prompt_pool_fields(model_session, "query"))).missing(queries) == queries


@pytest.fixture(scope="module")
def server():
    with FakeEmbeddingServer() as running:
        running.role_instructions = True  # a model that needs its roles: the prompts go before each text
        yield running


def reference_with_role_prompts():
    """mteb's encoder protocol over open_clip's own load of the bundled checkpoint, each text preceded by the
    role prompt of the ``prompt_type`` mteb passes (a document when none): what the server computes for each role."""
    import open_clip
    from mteb.models.abs_encoder import AbsEncoder

    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{ASSET}", device="cpu")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{ASSET}")

    class Reference(AbsEncoder):
        mteb_model_meta = model_meta("reference/tiny-shapes-clip", "roles")

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            prompt = ROLE_INSTRUCTIONS[str(prompt_type.value) if prompt_type is not None else "document"]
            out = []
            with torch.inference_mode():
                for batch in inputs:
                    parts = []
                    if "image" in batch:
                        parts.append(model.encode_image(torch.stack([preprocess(i) for i in batch["image"]])))
                    if "text" in batch:
                        parts.append(model.encode_text(tokenizer([prompt + t for t in batch["text"]])))
                    parts = [torch.nn.functional.normalize(p.float(), dim=-1) for p in parts]  # an API's rows
                    out.append(sum(parts[1:], parts[0]).numpy())
            return np.concatenate(out)

    return Reference()


@pytest.mark.full  # a local embedding server
@pytest.mark.parametrize("name", list(TASKS))
def test_an_api_model_with_roles_sends_mtebs_queries_as_queries(name, copies, server, tmp_path, monkeypatch):
    import mteb

    from clipcache.tasks.datasets.mieb.mieb_tasks import load_mieb

    monkeypatch.setenv("OPENAI_API_KEY", "sk-clipcache-test-roles")
    server.roles.clear()
    memo = FileHashMemo(None)
    spec = ModelSpec(model_name="api:tiny-shapes-clip", api_base=server.api_base, api_format="cohere")
    api_session = ModelSession(resolve_model(spec, memo), torch.device("cpu"), amp=False, precision="fp32")
    assert api_session.resolved.text_roles
    store = EmbeddingStore(tmp_path / "cache")
    source = DataSource(f"mieb:{name}", str(copies[name]))
    scored = evaluate_one("mieb", api_session, source, store, memo, encode=EncodeSettings(BATCH, 0))
    sent = {role: sum(n for r, n in server.roles if r == role) for role in ("query", "document")}
    assert sent["query"] == N  # each query text once, as a query; the corpus texts and the canaries as documents
    assert sent["document"] >= (N if "text" in TASKS[name][1] else 0)

    task = load_mieb(name, copies[name], "test", "en").task
    result = mteb.evaluate(reference_with_role_prompts(), task, cache=None, co2_tracker=False,
                           show_progress_bar=False, encode_kwargs={"batch_size": BATCH})
    [theirs] = result.task_results[0].scores["test"]
    assert_equal_scores(scored.metrics, theirs)

    requests = server.requests  # a rerun reads both pools: nothing is sent, the scores are the same
    rerun = evaluate_one("mieb", api_session, source, store, memo, encode=EncodeSettings(BATCH, 0))
    assert server.requests == requests
    assert all(math.isclose(v, scored.metrics[k]) or (math.isnan(v) and math.isnan(scored.metrics[k]))
               for k, v in rerun.metrics.items())
    queries = sorted(query_texts(copies[name]))
    assert TextPool(store, digest(prompt_pool_fields(api_session, "query"))).missing(queries) == []


# The ids these experiments had before mteb's roles reached the model (pinned from the code of 96ce28a): a fake
# mieb: copy's identity ("0" * 64) and a pinned API revision, so the ids depend on nothing else.
OLD_IDS = {("tiny-shapes-clip", "mieb"): "2fa634458f6c6c13", ("tiny-shapes-clip", "text_retrieval"): "30c4e5dc9d2fb5c5",
           ("api:tiny-shapes-clip", "mieb"): "89b04a2ddb6ba3b5", ("api:tiny-shapes-clip", "text_retrieval"):
           "c1ccd06ca6f4edec"}


def api_spec(**fields) -> ModelSpec:
    return ModelSpec(model_name="api:tiny-shapes-clip", api_base="http://127.0.0.1:9/v1", api_format="cohere",
                     api_revision="2026-11-28", **fields)


def experiment(spec: ModelSpec, task: str):
    from clipcache.tasks.contract import Prepared, ScoreSettings
    from clipcache.tasks.evaluation import get_task
    from clipcache.tasks.identity import experiment_for

    model_session = ModelSession(resolve_model(spec, FileHashMemo(None)), torch.device("cpu"), amp=False,
                                 precision="fp32")
    dataset = "mieb:WebQAT2TRetrieval" if task == "mieb" else "some-retrieval-set"
    prepared = Prepared(None, N, DataSource(dataset), prompts_sha256="0" * 64)
    return experiment_for(spec, model_session, get_task(task), prepared, ScoreSettings()), model_session


def test_an_api_models_mieb_experiment_with_roles_is_a_new_one_and_every_other_id_stays():
    """Queries embedded as queries are other vectors: the experiment of an api: model with roles on a mieb: task
    carries mteb_roles (a new id; the old one keeps its results). Local models and other tasks keep their ids."""
    from clipcache.storage.experiment import MTEB_ROLES, REFERENCE_OPTIONS
    from clipcache.storage.sql_rules import render

    for spec in (ModelSpec(model_name="tiny-shapes-clip"), api_spec()):
        for task in ("mieb", "text_retrieval"):
            made, model_session = experiment(spec, task)
            new = task == "mieb" and spec.model_name.startswith("api:")
            assert made.option_values == (MTEB_ROLES if new else {})
            assert (made.id != OLD_IDS[spec.model_name, task]) == new, (spec.model_name, task)
            assert made.is_reference  # not a what-if: the leaderboard's value for the pair
    assert all(option in render("latest_metrics") for option in REFERENCE_OPTIONS)
    roles_off, model_session = experiment(api_spec(api_roles="off"), "mieb")  # queries and documents alike
    assert not model_session.resolved.text_roles and roles_off.options == "{}"
    prefixed, model_session = experiment(api_spec(api_roles="off", api_query_prefix="query: "), "mieb")
    assert model_session.resolved.text_roles and prefixed.option_values == MTEB_ROLES


def test_a_rescore_without_the_query_vectors_says_why_in_one_line(tmp_path):
    """A cached_only rescore of an api: model's mieb: task whose cache holds only what runs before mteb_roles wrote
    (its queries as documents) misses the query vectors and says that those runs were another experiment."""
    from clipcache.tasks.contract import CacheMissError
    from clipcache.tasks.encode.mteb_encoder import CachedMtebEncoder

    _, model_session = experiment(api_spec(), "mieb")
    encoder = CachedMtebEncoder(model_session, EmbeddingStore(tmp_path / "cache"), batch_size=BATCH, cached_only=True)
    with pytest.raises(CacheMissError) as raised:
        encoder._text_vectors(["a photo of a cat."], "WebQAT2TRetrieval", "query")
    message = str(raised.value)
    assert "\n" not in message and "1 query text embeddings of mteb task WebQAT2TRetrieval" in message
    assert "mteb_roles" in message and "as documents" in message
