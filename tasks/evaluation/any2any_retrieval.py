"""Any-to-any retrieval over a user's corpus (MIEB's Any2AnyRetrieval family): queries and documents are images or
texts, embedded by the one image-text model, ranked by cosine similarity, scored with the text-retrieval metrics
(nDCG / MAP / recall / precision / MRR @k, as beir's EvaluateRetrieval reports them).

The folder is BEIR's layout with an ``image`` field allowed in place of ``text``::

    <root>/corpus.jsonl    {"_id": "d1", "image": "images/cat.jpg"}   or   {"_id": "d2", "text": "a cat"}
    <root>/queries.jsonl   {"_id": "q1", "text": "a photo of a cat"}  or   {"_id": "q2", "image": "queries/x.png"}
    <root>/qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score   (or qrels.jsonl)

Image paths are relative to the folder (or absolute). So image->image, text->image, image->text and text->text all
live in one folder, mixed as the user likes. Each side's images and texts are separate cache entries; a rescore with
other k values reads only the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.base import EvalDataset, iter_jsonl_records, resolve_image_path
from clipcache.tasks.evaluation.base import (
    DataSource,
    Encoded,
    EncodeSettings,
    EvalTask,
    Prepared,
    PromptSettings,
    Scored,
    ScoreSettings,
)

if TYPE_CHECKING:
    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.storage.hashing import FileHashMemo
    from clipcache.tasks.progress import StageProgress

K_ALWAYS = 10


@dataclass
class SideImages(EvalDataset):
    """The images of one side (corpus or queries) as a dataset the image encoder walks."""

    paths: list[Path] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    root: Path = Path(".")

    def __len__(self) -> int:
        return len(self.paths)

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": "any2any-images", "images": memo.fingerprint(self.paths, root=self.root)}

    def describe(self, index: int) -> str:
        return f"{self.paths[index]} ({self.where[index]})"

    def read_image_bytes(self, index: int) -> bytes:
        return self.paths[index].read_bytes()


@dataclass
class Side:
    """One side's records in file order: each is an image (row in ``images``) or a text (row in ``texts``)."""

    ids: list[str]
    is_image: np.ndarray  # bool per record
    row: np.ndarray  # per record: its row among the side's images or among its texts
    images: SideImages
    texts: list[str]


@dataclass
class Any2AnyData:
    name: str
    split: str
    root: Path
    corpus: Side
    queries: Side
    relevant: list[np.ndarray]  # per query: corpus positions with score > 0
    gains: list[np.ndarray]
    files: list[Path]

    def identity(self, memo: FileHashMemo) -> dict[str, Any]:
        return {"format": "any2any", "content": memo.fingerprint(self.files, root=self.root)}


def _read_side(path: Path, name: str, split: str, side: str, keep: set[str] | None = None,
               limit: int | None = None) -> Side:
    if not path.is_file():
        raise DatasetError(f"any-to-any folder {path.parent}: {path.name} is missing")
    images = SideImages(name=f"{name}:{side}", split=split, task="zeroshot_retrieval", root=path.parent)
    ids: list[str] = []
    texts: list[str] = []
    is_image: list[bool] = []
    rows: list[int] = []
    seen: set[str] = set()
    for line_no, record in iter_jsonl_records(path, ("_id",)):
        where = f"{path} line {line_no}"
        rid = str(record["_id"])
        if rid in seen:
            raise DatasetError(f"{where}: _id {rid!r} appears twice")
        seen.add(rid)
        if keep is not None and rid not in keep:
            continue
        if limit is not None and len(ids) >= limit:
            break
        has_image, has_text = "image" in record, "text" in record
        if has_image == has_text:
            raise DatasetError(f"{where}: give exactly one of 'image' (a path) and 'text' "
                               f"({'both' if has_image else 'neither'} given)")
        if has_image:
            image = resolve_image_path(str(record["image"]), path.parent)
            if image is None:
                raise DatasetError(f"{where}: image {record['image']!r} not found (paths are relative to "
                                   f"{path.parent})")
            rows.append(len(images.paths))
            images.paths.append(image)
            images.where.append(where)
        else:
            if not isinstance(record["text"], str):
                raise DatasetError(f"{where}: 'text' must be a string")
            rows.append(len(texts))
            texts.append(record["text"])
        ids.append(rid)
        is_image.append(has_image)
    return Side(ids, np.asarray(is_image, dtype=bool), np.asarray(rows, dtype=np.int64), images, texts)


def open_any2any(name: str, root: Path, split: str, limit: int | None) -> Any2AnyData:
    """Queries with at least one relevant document are evaluated (as pytrec_eval does); ``limit`` keeps the first N
    of them. The whole corpus is always searched."""
    from clipcache.tasks.convert.beir import qrels_path, read_qrels

    root = Path(root)
    qrels_file = qrels_path(root, split)
    if not qrels_file.is_file():
        raise DatasetError(f"any-to-any folder {root}: qrels/{split}.tsv (or qrels.jsonl) is missing")
    qrels = read_qrels(qrels_file)
    corpus = _read_side(root / "corpus.jsonl", name, split, "corpus")
    position = {d: i for i, d in enumerate(corpus.ids)}
    judged = {q: {d: s for d, s in docs.items() if s > 0 and d in position} for q, docs in qrels.items()}
    wanted = {q for q, docs in judged.items() if docs}
    queries = _read_side(root / "queries.jsonl", name, split, "queries", keep=wanted, limit=limit)
    if not queries.ids:
        raise DatasetError(f"any-to-any folder {root}: no query of split {split!r} has a relevant document in the "
                           f"corpus")
    relevant = [np.array([position[d] for d in judged[q]], dtype=np.int64) for q in queries.ids]
    gains = [np.array(list(judged[q].values()), dtype=np.float64) for q in queries.ids]
    files = [root / "corpus.jsonl", root / "queries.jsonl", qrels_file]
    return Any2AnyData(name, split, root, corpus, queries, relevant, gains, files)


class Any2AnyRetrieval(EvalTask):
    name = "any2any_retrieval"
    short = "any2any"
    description = "images and texts as queries and documents (MIEB Any2Any): ndcg, map, recall, precision, mrr @k"
    needs = ("corpus_image", "corpus_text", "query_image", "query_text")  # never sharded: user-sized corpora
    reads = ("any2any",)
    main_metrics = (("ndcg", 10, "ndcg@10", 1),)

    def prepare(self, source: DataSource, prompts: PromptSettings, progress: StageProgress) -> Prepared:
        from clipcache.tasks.datasets import format_root

        if not source.root:
            raise DatasetError("any2any_retrieval needs --dataset_root: a folder with corpus.jsonl, queries.jsonl "
                               "(records with 'image' or 'text') and qrels/<split>.tsv")
        data = open_any2any(source.name, format_root(source.root, source.name), source.split, source.limit)
        return Prepared(data, len(data.queries.ids), source)

    def encode(self, session: Any, prepared: Prepared, store: EmbeddingStore, memo: FileHashMemo,
               settings: EncodeSettings, progress: StageProgress, *,
               sharded: dict[str, Any] | None = None) -> Encoded:
        from clipcache.tasks.encode.stage import check_cached, encode_images, encode_texts

        started = time.perf_counter()
        data: Any2AnyData = prepared.data
        identity = data.identity(memo)
        base = {"model": session.resolved.identity, "precision": session.precision, "dataset": identity,
                "split": data.split, "limit": prepared.source.limit}
        wanted: dict[str, tuple[dict, Side]] = {}
        for side_name, side in (("corpus", data.corpus), ("query", data.queries)):
            if len(side.images):
                wanted[f"{side_name}_image"] = ({**base, "role": f"{side_name}_image",
                                                 "images": side.images.identity(memo)}, side)
            if side.texts:
                wanted[f"{side_name}_text"] = ({**base, "role": f"{side_name}_text"}, side)
        memo.save()
        if settings.cached_only:
            check_cached(store, [(fields, f"{role.replace('_', ' ')} embeddings of {data.name}")
                                 for role, (fields, _) in wanted.items()])
        outcomes = {}
        for role, (fields, side) in wanted.items():
            if role.endswith("_image"):
                outcomes[role] = encode_images(session, side.images, store, fields, settings, progress)
            else:
                outcomes[role] = encode_texts(session, side.texts, store, fields, kind=role.replace("_", " "),
                                              batch_size=settings.batch_size, progress=progress, label=data.name,
                                              meta={"dataset": data.name, "split": data.split})
        return Encoded(outcomes, seconds=time.perf_counter() - started)

    def score(self, store: EmbeddingStore, encoded: Encoded, prepared: Prepared, settings: ScoreSettings) -> Scored:
        from clipcache.tasks.score.text_retrieval import text_retrieval_metrics

        started = time.perf_counter()
        data: Any2AnyData = prepared.data
        docs, doc_ok = _side_matrix(store, encoded, "corpus", data.corpus)
        queries, query_ok = _side_matrix(store, encoded, "query", data.queries)
        # documents whose image was skipped as undecodable leave the corpus; queries without a judged document left
        # in it are not scored (as pytrec_eval skips queries without relevant documents)
        new_position = np.cumsum(doc_ok) - 1
        relevant, gains, rows = [], [], []
        for q in np.flatnonzero(query_ok):
            keep = doc_ok[data.relevant[q]]
            if keep.any():
                relevant.append(new_position[data.relevant[q][keep]])
                gains.append(data.gains[q][keep])
                rows.append(q)
        if not rows:
            raise DatasetError(f"any-to-any folder {data.root}: no query is left with a relevant document")
        k_values = sorted(set(settings.recall_k) | {K_ALWAYS})
        metrics = text_retrieval_metrics(queries[rows], docs[doc_ok], relevant, gains, k_values)
        skipped = int((~doc_ok).sum() + (~query_ok).sum())
        if skipped:
            metrics["skipped_images"] = float(skipped)
        return Scored(metrics, len(rows), seconds=time.perf_counter() - started)


def _side_matrix(store: Any, encoded: Encoded, side_name: str, side: Side) -> tuple[np.ndarray, np.ndarray]:
    """The side's embeddings in record order, and which records have one (an image skipped as undecodable has
    none)."""
    from clipcache.tasks.score.stage import _expect

    n = len(side.ids)
    ok = np.ones(n, dtype=bool)
    out: np.ndarray | None = None
    for kind, mask in (("image", side.is_image), ("text", ~side.is_image)):
        outcome = encoded.outcomes.get(f"{side_name}_{kind}")
        if outcome is None:
            continue
        entry = store.open(outcome.ref.key)
        vectors = entry.embeddings()
        if out is None:
            out = np.zeros((n, entry.dim), dtype=np.float32)
        _expect(entry.dim == out.shape[1], entry, f"its embeddings have {entry.dim} dimensions, the other "
                                                  f"side's {out.shape[1]}")
        records = np.flatnonzero(mask)
        if kind == "image":
            expected = len(side.images)
            _expect(int(entry.meta.get("n_samples", entry.count)) == expected, entry,
                    f"it holds rows of {entry.meta.get('n_samples', entry.count)} images, the folder has {expected}")
            row_of = np.full(expected, -1, dtype=np.int64)
            row_of[entry.array("position")] = np.arange(entry.count)
            rows = row_of[side.row[records]]
            ok[records[rows < 0]] = False
            out[records[rows >= 0]] = vectors[rows[rows >= 0]]
        else:
            _expect(entry.count == len(side.texts), entry,
                    f"it holds {entry.count} texts, the folder has {len(side.texts)}")
            out[records] = vectors[side.row[records]]
    assert out is not None
    return out, ok
