"""visual_document_retrieval (ViDoRe) on local copies of ViDoRe's hub layouts, with the tiny model: the v1
question-answering rows and their BEIR conversion (built here as ViDoRe's own conversion builds it) give the same
numbers, and both equal mteb's own ViDoRe task (its loader, pytrec_eval) on the BEIR copy with the same model
uncached; a v2 copy with translated queries, graded and all-zero judgments equals mteb per language; each distinct
page and query is encoded once; ``mieb:Vidore...`` equals mteb and re-runs with no forward pass; bad data is one
line."""

from __future__ import annotations

import hashlib
import io

import pytest
from PIL import Image

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import default_task, shapes
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings

from mieb_fixtures import BATCH, BEIR_README, mteb_uncached, session, write_configs

N_PAGES = 14
PAGE = (180, 250)  # larger than the model's input, not square: the model's own resize and crop apply
FAMILIES = ("ndcg", "map", "recall", "precision", "mrr")
K_VALUES = (1, 3, 5, 10, 20, 100, 1000)
V1_TASK, V2_TASK = "VidoreTabfquadRetrieval", "Vidore2ESGReportsRetrieval"
def page_png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.resize(PAGE, Image.Resampling.NEAREST).save(out, format="PNG")
    return out.getvalue()


def qa_rows() -> list[dict]:
    """ViDoRe v1's rows: one a page, its query a caption of the page. Page 0 is asked twice (two rows, the same
    bytes), the last page by no query (null), and one query text is asked of two pages."""
    data = shapes.load_shapes("fixture", "zeroshot_retrieval", "test", N_PAGES)
    pages = [page_png(data.load_image(i)) for i in range(N_PAGES)]
    captions = data.captions or []
    rows = [{"query": captions[i][0], "image": pages[i], "image_filename": f"p{i}.png", "answer": "x"}
            for i in range(N_PAGES - 1)]
    rows.append({"query": captions[0][1], "image": pages[0], "image_filename": "p0.png", "answer": "y"})
    rows.append({"query": None, "image": pages[N_PAGES - 1], "image_filename": "last.png", "answer": None})
    rows.append({"query": captions[3][0], "image": pages[5], "image_filename": "p5.png", "answer": "z"})
    return rows


def write_qa_copy(root, rows):
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    features = Features({"query": Value("string"), "image": ImageFeature(), "image_filename": Value("string"),
                         "answer": Value("string")})
    table = Dataset.from_dict({k: [({"bytes": r[k], "path": None} if k == "image" else r[k]) for r in rows]
                               for k in features}, features=features)
    (root / "data").mkdir(parents=True)
    table.to_parquet(str(root / "data" / "test-00000-of-00001.parquet"))
    return root


def beir_parts(rows):
    """ViDoRe's own QA -> BEIR conversion (vidore-benchmark's convert_ds_to_beir): pages by the MD5 of their
    decoded pixels in first-seen order, distinct non-null queries in first-seen order, a qrel (score 1.0) per row."""
    page_of_hash: dict[str, int] = {}
    first_row: dict[int, int] = {}
    query_ids: dict[str, int] = {}
    for i, row in enumerate(rows):
        pixels = hashlib.md5(Image.open(io.BytesIO(row["image"])).tobytes()).hexdigest()
        if pixels not in page_of_hash:
            page_of_hash[pixels] = len(page_of_hash)
            first_row[page_of_hash[pixels]] = i
        row["_page"] = page_of_hash[pixels]
        if row["query"] is not None and row["query"] not in query_ids:
            query_ids[row["query"]] = len(query_ids)
    corpus = [(p, rows[i]["image"]) for p, i in first_row.items()]
    queries = [(q, text) for text, q in query_ids.items()]
    qrels = [(query_ids[r["query"]], r["_page"], 1.0) for r in rows if r["query"] is not None]
    return corpus, queries, qrels


def write_beir_copy(root, corpus, queries, qrels, languages=None):
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    parts = {
        "corpus": Dataset.from_dict({"corpus-id": [c for c, _ in corpus],
                                     "image": [{"bytes": b, "path": None} for _, b in corpus]},
                                    features=Features({"corpus-id": Value("int64"), "image": ImageFeature()})),
        "queries": Dataset.from_dict({"query-id": [q for q, _ in queries], "query": [t for _, t in queries],
                                      **({"language": languages} if languages else {})}),
        "qrels": Dataset.from_dict({"query-id": [q for q, _, _ in qrels], "corpus-id": [d for _, d, _ in qrels],
                                    "score": [s for _, _, s in qrels]}),
    }
    return write_configs(root, parts, BEIR_README)


def v2_parts(rows):
    """ViDoRe v2's shape: every query in English and French (a language column), graded judgments (2 for the
    first pages), and one English query judged 0 only."""
    corpus, queries, qrels = beir_parts(rows)
    n = len(queries)
    translated = queries + [(q + 100, f"en francais: {t}") for q, t in queries] + [(999, "a page about nothing")]
    languages = ["english"] * n + ["french"] * n + ["english"]
    graded = [(q, d, 2 if d < 4 else 1) for q, d, _ in qrels]
    graded += [(q + 100, d, s) for q, d, s in graded] + [(999, 7, 0)]
    return corpus, translated, graded, languages


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    base = tmp_path_factory.mktemp("vidore")
    rows = qa_rows()
    qa = write_qa_copy(base / "tabfquad_test_subsampled", rows)
    beir = write_beir_copy(base / "tabfquad_test_subsampled_beir", *beir_parts(rows))
    corpus, queries, qrels, languages = v2_parts(rows)
    v2 = write_beir_copy(base / "esg_reports_v2", corpus, queries, qrels, languages)
    return {"qa": qa, "beir": beir, "v2": v2}


def counting(model_session, monkeypatch):
    counts = {"images": 0, "texts": 0}
    model = model_session.model

    def counted(kind, original):
        def call(batch):
            counts[kind] += len(batch)
            return original(batch)
        return call

    monkeypatch.setattr(model, "image_features_and_norms", counted("images", model.image_features_and_norms))
    monkeypatch.setattr(model, "encode_texts_with_norms", counted("texts", model.encode_texts_with_norms))
    return counts


def run(root, store, model_session, memo, language="en", limit=None):
    source = DataSource("vidore", str(root), language=language, limit=limit)
    return evaluate_one("visual_document_retrieval", model_session, source, store, memo,
                        encode=EncodeSettings(BATCH, 0), score=ScoreSettings(bootstrap=50))


def assert_equal_to_mteb(ours, theirs):
    for family in FAMILIES:
        for k in K_VALUES:
            # mteb rounds to 5 decimals (mrr excepted)
            assert ours[f"{family}@{k}"] == pytest.approx(theirs[f"{family}_at_{k}"], abs=6e-6), f"{family}@{k}"


def test_v1_rows_and_their_beir_conversion_equal_mteb(copies, tmp_path, monkeypatch):
    model_session, memo = session()
    counts = counting(model_session, monkeypatch)
    store = EmbeddingStore(tmp_path / "cache")
    qa = run(copies["qa"], store, model_session, memo)
    # 16 rows: 14 distinct pages, 14 distinct query texts (one asked of two pages, a null one)
    assert counts == {"images": N_PAGES, "texts": N_PAGES}
    assert qa.n_samples == N_PAGES
    beir = run(copies["beir"], store, model_session, memo)
    theirs, _ = mteb_uncached(V1_TASK, copies["beir"], model_session.model)
    assert_equal_to_mteb(qa.metrics, theirs)
    assert_equal_to_mteb(beir.metrics, theirs)
    assert 0.1 < qa.metrics["ndcg@5"] < 0.99  # not a trivial set
    low, high = qa.evidence.intervals["ndcg@5"][:2]
    assert low <= qa.metrics["ndcg@5"] <= high

    again, _ = session()  # a re-run reads the cache alone
    rerun = run(copies["qa"], store, again, memo)
    assert again.loads == 0 and rerun.metrics == qa.metrics


@pytest.mark.parametrize(("language", "subset"), [("en", "english"), ("french", "french")])
def test_v2_languages_graded_and_zero_judgments_equal_mteb(copies, tmp_path, language, subset):
    model_session, memo = session()
    ours = run(copies["v2"], EmbeddingStore(tmp_path / "cache"), model_session, memo, language=language)
    theirs, _ = mteb_uncached(V2_TASK, copies["v2"], model_session.model, subset)
    assert_equal_to_mteb(ours.metrics, theirs)
    assert ours.n_samples == N_PAGES + (subset == "english")  # the query judged 0 only counts in English


def test_tied_pages_rank_as_pytrec_eval(tmp_path, monkeypatch):
    """A page stored twice under two ids scores exactly alike: pytrec_eval (and so mteb) ranks the larger id, as
    text, first ("1000" > "10"); here the copy is relevant to no query and pushes the original down. The page is
    encoded once."""
    corpus, queries, qrels = beir_parts(qa_rows())
    root = write_beir_copy(tmp_path / "tied", corpus + [(1000, corpus[10][1])], queries, qrels)
    model_session, memo = session()
    counts = counting(model_session, monkeypatch)
    ours = run(root, EmbeddingStore(tmp_path / "cache"), model_session, memo)
    assert counts["images"] == N_PAGES
    theirs, _ = mteb_uncached(V1_TASK, root, model_session.model)
    assert_equal_to_mteb(ours.metrics, theirs)
    plain = run(write_beir_copy(tmp_path / "plain", corpus, queries, qrels), EmbeddingStore(tmp_path / "cache"),
                model_session, memo)
    assert ours.metrics["mrr@1000"] < plain.metrics["mrr@1000"]


def test_mieb_vidore_equals_mteb_and_reruns_without_a_forward_pass(copies, tmp_path):
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    source = DataSource(f"mieb:{V1_TASK}", str(copies["beir"]))
    scored = evaluate_one("mieb", model_session, source, store, memo, encode=EncodeSettings(BATCH, 0))
    theirs, _ = mteb_uncached(V1_TASK, copies["beir"], model_session.model)
    for family in FAMILIES:
        for k in K_VALUES:
            assert scored.metrics[f"mteb_{family}_at_{k}"] == pytest.approx(theirs[f"{family}_at_{k}"], abs=1e-6)
    assert scored.metrics["mteb_main_score"] == pytest.approx(theirs["ndcg_at_5"], abs=1e-6)
    again, _ = session()  # a new session: no forward pass can happen without loading the model
    rerun = evaluate_one("mieb", again, source, store, memo, encode=EncodeSettings(BATCH, 0))
    assert again.loads == 0
    assert rerun.metrics["mteb_main_score"] == scored.metrics["mteb_main_score"]


def test_the_folder_says_which_task(copies):
    assert default_task("vidore", str(copies["qa"])) == "visual_document_retrieval"
    assert default_task("vidore", str(copies["v2"])) == "visual_document_retrieval"


def test_bad_data_is_one_line(copies, tmp_path):
    from clipcache.tasks.datasets.mieb.vidore import open_vidore

    with pytest.raises(DatasetError, match=r"queries are in english, french; choose one with --language"):
        open_vidore("v", copies["v2"], "test", None, "ja")
    rows = qa_rows()
    corpus, queries, qrels = beir_parts(rows)
    bad = write_beir_copy(tmp_path / "bad", corpus, queries, qrels + [(0, 77, 1.0)])
    with pytest.raises(DatasetError, match=r"corpus-id '77' \(query '0'\), which is not in the corpus"):
        open_vidore("v", bad, "test", None)
    with pytest.raises(DatasetError, match=r"neither ViDoRe's question-answering rows"):
        open_vidore("v", tmp_path, "test", None)
    assert len(open_vidore("v", copies["qa"], "test", 3).queries.ids) == 3


def test_a_corrupt_page_is_one_line_naming_it(tmp_path):
    rows = qa_rows()
    rows[4]["image"] = rows[4]["image"][:60]  # a truncated PNG
    root = write_qa_copy(tmp_path / "corrupt", rows)
    model_session, memo = session()
    with pytest.raises(DatasetError) as error:
        run(root, EmbeddingStore(tmp_path / "cache"), model_session, memo)
    message = str(error.value)
    assert "test-00000-of-00001.parquet row 4 (page 4)" in message and "\n" not in message
