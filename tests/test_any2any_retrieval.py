"""any2any_retrieval: a folder mixing image and text queries and documents, scored equal to beir's
EvaluateRetrieval (pytrec_eval) on rankings computed independently with open_clip; bad records in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.any2any import open_any2any
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings, ScoreSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec


def write_folder(root: Path, n: int = 24) -> Path:
    """Shapes images and captions: text->image, image->text and image->image queries over a corpus of images and
    texts; graded relevance on some pairs."""
    from clipcache.tasks.datasets import shapes

    ds = shapes.load_shapes("fixture", "zeroshot_retrieval", "test", n)
    (root / "images").mkdir(parents=True)
    for i in range(n):
        ds.load_image(i).save(root / "images" / f"{i}.png")
    corpus = [{"_id": f"img{i}", "image": f"images/{i}.png"} for i in range(n // 2)]
    corpus += [{"_id": f"txt{i}", "text": ds.captions[i][0]} for i in range(n // 2, n)]
    queries, qrels = [], []
    for i in range(n // 2):  # text -> image
        queries.append({"_id": f"t2i{i}", "text": ds.captions[i][-1]})
        qrels.append((f"t2i{i}", f"img{i}", 1 + i % 2))
    for i in range(n // 2, n):  # image -> text
        queries.append({"_id": f"i2t{i}", "image": str(root / "images" / f"{i}.png")})  # an absolute path
        qrels.append((f"i2t{i}", f"txt{i}", 1))
    for i in range(0, n // 2, 3):  # image -> image: its own image and the next one
        queries.append({"_id": f"i2i{i}", "image": f"images/{i}.png"})
        qrels += [(f"i2i{i}", f"img{i}", 2), (f"i2i{i}", f"img{(i + 1) % (n // 2)}", 1)]
    queries.append({"_id": "unjudged", "text": "never asked"})
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                             "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
    return root


def session():
    memo = FileHashMemo(None)
    return ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                        amp=False, precision="fp32"), memo


def test_equal_to_beir_on_rankings_computed_with_open_clip(tmp_path, tiny_model_dir):
    from beir.retrieval.evaluation import EvaluateRetrieval
    from PIL import Image

    root = write_folder(tmp_path / "a2a")
    model_session, memo = session()
    scored = evaluate_one("any2any_retrieval", model_session, DataSource("mine", str(root)),
                          EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(8, 2),
                          score=ScoreSettings(recall_k=(1, 5)))
    # the reference: open_clip directly, every record embedded on its own path, pytrec_eval through beir
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{tiny_model_dir}", device="cpu")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{tiny_model_dir}")

    def embed(record):
        with torch.no_grad():
            if "image" in record:
                path = Path(record["image"]) if Path(record["image"]).is_absolute() else root / record["image"]
                return F.normalize(model.encode_image(transform(Image.open(path).convert("RGB"))[None]), dim=-1)[0]
            return F.normalize(model.encode_text(tokenizer([record["text"]])), dim=-1)[0]

    read = lambda name: [json.loads(line) for line in (root / name).read_text().splitlines()]  # noqa: E731
    corpus, queries = read("corpus.jsonl"), read("queries.jsonl")
    docs = torch.stack([embed(r) for r in corpus])
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    results = {q["_id"]: {corpus[j]["_id"]: float(s) for j, s in enumerate(docs @ embed(q))}
               for q in queries if q["_id"] in qrels}
    ks = [1, 5, 10]
    ndcg, _map, recall, precision = EvaluateRetrieval.evaluate(qrels, results, ks)
    mrr = EvaluateRetrieval.evaluate_custom(qrels, results, ks, "mrr")
    ours = scored.metrics
    assert scored.n_samples == len(qrels) == 24 + 4
    for k in ks:
        assert round(ours[f"ndcg@{k}"], 5) == ndcg[f"NDCG@{k}"]
        assert round(ours[f"map@{k}"], 5) == _map[f"MAP@{k}"]
        assert round(ours[f"recall@{k}"], 5) == recall[f"Recall@{k}"]
        assert round(ours[f"precision@{k}"], 5) == precision[f"P@{k}"]
        assert round(ours[f"mrr@{k}"], 5) == mrr[f"MRR@{k}"]
    assert ours["ndcg@10"] > 0.3  # a trained model finds its pairs
    # four entries, one per side and modality; a what-if over k reads only them
    store = EmbeddingStore(tmp_path / "cache")
    assert sorted(store.open(k).attrs["key_fields"]["role"] for k in store.keys()) == \
        ["corpus_image", "corpus_text", "query_image", "query_text"]
    again = evaluate_one("any2any_retrieval", model_session, DataSource("mine", str(root)), store, memo,
                         encode=EncodeSettings(8, 2, cached_only=True), score=ScoreSettings(recall_k=(1, 5)))
    assert again.metrics == ours


@pytest.mark.parametrize("record, message", [
    ({"_id": "x", "image": "images/0.png", "text": "both"}, "give exactly one of 'image' (a path) and 'text' (both"),
    ({"_id": "x"}, "give exactly one of 'image' (a path) and 'text' (neither"),
    ({"_id": "x", "image": "images/nope.png"}, "image 'images/nope.png' not found"),
    ({"_id": "img0", "text": "again"}, "_id 'img0' appears twice"),
    ({"_id": "x", "text": 3}, "'text' must be a string"),
])
def test_bad_corpus_records_are_one_line(tmp_path, record, message):
    root = write_folder(tmp_path / "a2a", n=6)
    with open(root / "corpus.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    with pytest.raises(DatasetError, match=f"corpus.jsonl line 7: .*{message.replace('(', '.').replace(')', '.')}"):
        open_any2any("mine", root, "test", None)


def test_limit_and_missing_files(tmp_path):
    root = write_folder(tmp_path / "a2a", n=6)
    data = open_any2any("mine", root, "test", 2)
    assert data.queries.ids == ["t2i0", "t2i1"] and len(data.corpus.ids) == 6
    assert np.array_equal(data.corpus.is_image, [True] * 3 + [False] * 3)
    (root / "qrels" / "test.tsv").unlink()
    with pytest.raises(DatasetError, match=r"qrels/test.tsv \(or qrels.jsonl\) is missing"):
        open_any2any("mine", root, "test", None)


def test_cli_runs_it(prefect_server, tmp_path, capsys):
    from clipcache.flows.cli import main

    root = write_folder(tmp_path / "a2a", n=12)
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", "mine", "--dataset_root", str(root), "--task",
                 "any2any_retrieval", "--quiet", "--output_dir", str(tmp_path / "out"), "--cache_dir",
                 str(tmp_path / "cache")]) == 0
    saved = json.loads((tmp_path / "out" / "tiny-shapes-clip" / "mine_any2any_retrieval.json").read_text())
    assert saved["task"] == "any2any_retrieval" and 0 < saved["metrics"]["ndcg@10"] <= 1
    capsys.readouterr()
    assert main(["cache", "--cache_dir", str(tmp_path / "cache"), "ls", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    # text queries against images are visual document retrieval's entries too (ViDoRe's folders are any2any data)
    served = {r["role"]: r["tasks"] for r in rows}
    assert served == {"corpus_image": ["any2any_retrieval", "visual_document_retrieval"],
                      "query_text": ["any2any_retrieval", "visual_document_retrieval"],
                      "corpus_text": ["any2any_retrieval"], "query_image": ["any2any_retrieval"]}
