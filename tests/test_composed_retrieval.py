"""composed_retrieval (CIRR / FashionIQ; MIEB's CIRRIT2IRetrieval): shapes images as a CIRR split, scored equal to
mteb's own CIRRIT2IRetrieval evaluation on the same cached embeddings (MIEB's hub layout built from the same data,
read by mteb's loader and by ours); CIRR's reference exclusion and pytrec_eval's tie order on a hand-computed case;
warehouse rows that recompute every metric; FashionIQ's files; a malformed annotation file in one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.tasks.datasets import check_name, default_task, shapes
from clipcache.tasks.datasets.mieb.composed_layouts import fashioniq_text, open_composed
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.score.composed_retrieval import composed_ranks
from clipcache.tasks.score.text_retrieval import per_query_metrics

from mieb_fixtures import RETRIEVAL_README, session, write_configs

N_IMAGES, N_QUERIES = 24, 16


def cirr_records():
    """A CIRR val split of shapes images: each query asks for another image's class ("make it a blue square")."""
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", N_IMAGES)
    labels = [int(x) for x in ds.labels]
    names = [f"dev-{i}-0-img0" for i in range(N_IMAGES)]
    records = []
    for q in range(N_QUERIES):
        reference, target = q, (q * 7 + 3) % N_IMAGES
        records.append({"pairid": 100 + q, "reference": names[reference], "target_hard": names[target],
                        "caption": f"make it a {shapes.CLASSNAMES[labels[target]]}" if q % 4 else "change it",
                        "target_soft": {names[target]: 1.0}, "img_set": {"id": q, "members": [names[target]]}})
    return ds, names, records


def write_cirr(root):
    ds, names, records = cirr_records()
    (root / "dev").mkdir(parents=True)
    for i, name in enumerate(names):
        ds.load_image(i).save(root / "dev" / f"{name}.png")
    for folder, content in (("captions/cap.rc2.val.json", records),
                            ("image_splits/split.rc2.val.json", {n: f"./dev/{n}.png" for n in names})):
        (root / folder).parent.mkdir(exist_ok=True)
        (root / folder).write_text(json.dumps(content))
    return root


def write_mieb_copy(root, cirr):
    """mteb/mbeir_cirr_task7's layout (configs corpus: id, image; queries: id, text, image; default: qrels) from the
    same images and queries; corpus ids are the CIRR names, so pytrec_eval breaks ties alike."""
    from datasets import Dataset, Features, Image, Value

    _, names, records = cirr_records()
    image = {n: {"bytes": (cirr / "dev" / f"{n}.png").read_bytes(), "path": f"{n}.png"} for n in names}  # embedded
    parts = {
        "corpus": Dataset.from_dict({"id": names, "image": [image[n] for n in names]},
                                    features=Features({"id": Value("string"), "image": Image()})),
        "queries": Dataset.from_dict({"id": [str(r["pairid"]) for r in records],
                                      "text": [r["caption"] for r in records],
                                      "image": [image[r["reference"]] for r in records]},
                                     features=Features({"id": Value("string"), "text": Value("string"),
                                                        "image": Image()})),
        "default": Dataset.from_dict({"query-id": [str(r["pairid"]) for r in records],
                                      "corpus-id": [r["target_hard"] for r in records],
                                      "score": [1] * len(records)}),
    }
    return write_configs(root, parts, RETRIEVAL_README)


def test_reference_exclusion_and_tie_order_on_a_hand_computed_case():
    """Gallery ids a..e. Query 0: its reference (c) scores highest; excluded, the target b is 1st, kept it is 2nd.
    Query 1: target d ties with e and a: pytrec_eval puts e (id above d) first, then d, then a, so d is 2nd and
    recall@1 is decided by the tie. Query 2: the reference is its target, so it stays a candidate."""
    gallery = np.array([[0.6, 0.8], [0.8, 0.6], [1, 0], [0, 1], [0, 1]], np.float32)
    ids = ["a", "b", "c", "d", "e"]
    gallery[0] = [0, 1]  # a ties with d and e
    image = np.array([[1, 0], [0, 1], [1, 0]], np.float32)
    text = np.zeros_like(image)
    targets, gains = [np.array([1]), np.array([3]), np.array([2])], [np.ones(1)] * 3
    excluded = composed_ranks(image, text, gallery, targets, gains, gallery_ids=ids, excluded=np.array([2, -1, 2]))
    kept = composed_ranks(image, text, gallery, targets, gains, gallery_ids=ids)
    assert [r.tolist() for r in excluded.ranked.ranks] == [[0], [1], [0]]
    assert [r.tolist() for r in kept.ranked.ranks] == [[1], [1], [0]]
    assert excluded.tied(1).tolist() == [False, True, False] and excluded.tied(5).tolist() == [False] * 3
    assert excluded.ranked.top[1].tolist() == [4, 3, 0] and excluded.ranked.top[0][0] == 1
    recall = per_query_metrics(excluded.ranked.ranks, excluded.ranked.gains, [1, 2])
    assert recall["recall@1"].tolist() == [1, 0, 1] and recall["recall@2"].tolist() == [1, 1, 1]


def test_equal_to_mteb_cirr_it2i_on_the_cached_embeddings(tmp_path, monkeypatch):
    import datasets
    from mteb.models.abs_encoder import AbsEncoder

    from clipcache.tasks.datasets.mieb.mieb_tasks import load_mieb

    # a fresh datasets cache: a shared one can hand back another run's copy of a same-named temporary folder
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    cirr = write_cirr(tmp_path / "cirr")
    hub = write_mieb_copy(tmp_path / "hub", cirr)
    check_name("shapes_cirr", str(cirr))
    assert default_task("shapes_cirr", str(cirr)) == default_task("shapes_cirr", str(hub)) == "composed_retrieval"
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    run = {reference: evaluate_one("composed_retrieval", model_session, DataSource("shapes_cirr", str(cirr),
                                                                                   split="val"),
                                   store, memo, encode=EncodeSettings(8, 0), options={"reference_image": reference})
           for reference in ("keep", "exclude")}
    data = open_composed("shapes_cirr", cirr, "val", None)
    # the raw features (row x norm): what mteb's OpenCLIP wrapper hands its evaluator and sums for image + text
    entries = {store.open(k).attrs["key_fields"]["role"]: store.open(k).raw_embeddings("test") for k in store.keys()}
    assert {r: len(v) for r, v in entries.items()} == {"composed_image": N_IMAGES, "modifier_text": len(data.texts)}
    assert len(data.texts) < N_QUERIES  # "change it" is one text, encoded once
    pixels = {}
    for i in range(len(data.images)):
        picture = data.images.load_image(i)
        pixels[picture.size, picture.tobytes()] = entries["composed_image"][i]
    texts = dict(zip(data.texts, entries["modifier_text"], strict=True))

    class CachedEncoder(AbsEncoder):
        """mteb's OpenCLIP wrapper's encode (image + text input: text_embeddings + image_embeddings) over the
        cached vectors."""

        def __init__(self):
            pass

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            features, text, image = inputs.dataset.features, None, None
            if "text" in features:
                text = torch.from_numpy(np.stack([texts[t] for batch in inputs for t in batch["text"]]))
            if "image" in features:
                image = torch.from_numpy(np.stack([pixels[i.convert("RGB").size, i.convert("RGB").tobytes()]
                                                   for batch in inputs for i in batch["image"]]))
            return text + image if text is not None and image is not None else text if text is not None else image

    task = load_mieb("CIRRIT2IRetrieval", hub, "test", "en").task
    theirs = task.evaluate(CachedEncoder(), "test", encode_kwargs={"batch_size": 8, "show_progress_bar": False})
    theirs = theirs["default"]
    ours = run["keep"].metrics  # MIEB keeps the reference among the candidates
    for k in (1, 5, 10):
        assert round(ours[f"recall@{k}"], 5) == theirs[f"recall_at_{k}"]
    assert round(ours["ndcg@10"], 5) == theirs["ndcg_at_10"] == theirs["main_score"]
    # the hub layout read by this task gives the same numbers, query for query
    hub_run = evaluate_one("composed_retrieval", model_session, DataSource("shapes_cirr", str(hub)), store, memo,
                           encode=EncodeSettings(8, 0))
    assert hub_run.metrics == {m: v for m, v in ours.items() if not m.startswith(("recall_subset", "cirr_avg"))}
    assert hub_run.evidence.columns["rank"].tolist() == run["keep"].evidence.columns["rank"].tolist()
    # CIRR's protocol removes the reference: never worse, and the default for CIRR's files
    excluded = run["exclude"].metrics
    assert all(excluded[m] >= ours[m] for m in ours) and excluded["recall@50"] == 1.0
    default = evaluate_one("composed_retrieval", model_session, DataSource("shapes_cirr", str(cirr), split="val"),
                           store, memo, encode=EncodeSettings(8, 0))
    assert default.metrics == excluded
    assert excluded["recall@5"] > 5 / N_IMAGES  # a trained model, above chance


def cli(command, root, tmp_path, *extra):
    return main([command, "--model", "tiny-shapes-clip", "--dataset", "shapes_cirr", "--dataset_root", str(root),
                 "--task", "composed_retrieval", "--split", "val", "--orchestrator", "local", "--quiet",
                 "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), *extra])


def test_cli_warehouse_rows_recompute_every_metric_and_rescore_loads_no_model(tmp_path, monkeypatch):
    root = write_cirr(tmp_path / "cirr")
    assert cli("eval", root, tmp_path) == 0
    saved = json.loads((tmp_path / "out" / "tiny-shapes-clip" / "shapes_cirr_composed_retrieval.json").read_text())
    assert saved["task"] == "composed_retrieval"
    assert set(saved["metrics"]) == {"recall@1", "recall@5", "recall@10", "recall@50", "ndcg@10", "recall_subset@1",
                                     "recall_subset@2", "recall_subset@3", "cirr_avg"}  # CIRR's img_set: subsets
    con = connect(str(tmp_path / "out"))
    stored = {(m, k): v for m, k, v in con.execute("SELECT metric, k, value FROM metrics WHERE task = "
                                                   "'composed_retrieval'").fetchall()}
    rows = con.sql("SELECT * FROM latest_samples WHERE task = 'composed_retrieval' AND unit = 'query' "
                   "ORDER BY sample_index").to_arrow_table().to_pydict()
    _, names, records = cirr_records()
    assert rows["sample_key"] == [str(r["pairid"]) for r in records]
    assert rows["target"] == [names.index(r["target_hard"]) for r in records]
    rank = np.array(rows["rank"])  # 1-based; one target per query
    for k in (1, 5, 10, 50):
        assert stored["recall", k] == np.mean(rank <= k) == saved["metrics"][f"recall@{k}"]
        assert rows["hits_at"] and all((k in hits) == (r <= k) for hits, r in zip(rows["hits_at"], rank, strict=True))
    assert stored["ndcg", 10] == pytest.approx(np.mean(np.where(rank <= 10, 1 / np.log2(rank + 1), 0)), abs=1e-12)
    assert all(r not in (names.index(rec["reference"]),) or r == t
               for r, t, rec in zip([top[0] for top in rows["top"]], rows["target"], records, strict=True))

    def no_model(*args, **kwargs):
        raise AssertionError("rescore loaded the model")

    monkeypatch.setattr("clipcache.tasks.encode.stage.load_model", no_model)
    assert cli("rescore", root, tmp_path, "--output_dir", str(tmp_path / "again")) == 0
    again = json.loads((tmp_path / "again" / "tiny-shapes-clip" / "shapes_cirr_composed_retrieval.json").read_text())
    assert again["metrics"] == saved["metrics"]


def test_fashioniq_files(tmp_path):
    ds, names, records = cirr_records()
    root = tmp_path / "fiq"
    (root / "images").mkdir(parents=True)
    ids = [f"B00{i:04d}" for i in range(N_IMAGES)]
    for i, image_id in enumerate(ids):
        ds.load_image(i).save(root / "images" / f"{image_id}.png")
    (root / "captions").mkdir()
    (root / "image_splits").mkdir()
    captions = [{"candidate": ids[q], "target": ids[(q * 7 + 3) % N_IMAGES], "captions": ["is red.", "has corners"]}
                for q in range(6)]
    for category in ("dress", "shirt"):
        (root / "captions" / f"cap.{category}.val.json").write_text(json.dumps(captions))
        (root / "image_splits" / f"split.{category}.val.json").write_text(json.dumps(ids))
    data = open_composed("fashioniq_dress", root, "val", 4)
    assert data.layout == "fashioniq" and not data.excludes_reference and len(data.targets) == 4
    assert data.texts == ["Is red and has corners"] == [fashioniq_text(["is red.", "has corners"])]
    assert data.reference.tolist() == [0, 1, 2, 3] and [t.tolist() for t in data.targets] == [[3], [10], [17], [0]]
    with pytest.raises(Exception, match=r"name the category in the dataset name \(e.g. fiq_dress\); the val split "
                                        r"has dress, shirt"):
        open_composed("fiq", root, "val", None)


@pytest.mark.parametrize("mangle, message", [
    (lambda text: text[:-5], r"captions/cap.rc2.val.json: not valid JSON \(.*\); expected CIRR's list of caption "
                             r"records"),
    (lambda text: json.dumps([{"pairid": 1, "reference": "dev-0-0-img0", "caption": "x"}]),
     r"cap.rc2.val.json record 0: no 'target_hard' \(CIRR's test1 targets are hidden"),
    (lambda text: json.dumps([{"pairid": 1, "reference": "dev-0-0-img0", "target_hard": 3, "caption": "x"}]),
     r"cap.rc2.val.json record 0: expected an object with 'reference' and 'target_hard' and 'caption' as non-empty"),
    (lambda text: json.dumps([{"pairid": 1, "reference": "nope", "target_hard": "dev-1-0-img0", "caption": "x"}]),
     r"cap.rc2.val.json record 0: reference 'nope' is not in .*split.rc2.val.json"),
])
def test_a_malformed_annotation_file_is_one_line(tmp_path, capsys, mangle, message):
    root = write_cirr(tmp_path / "cirr")
    path = root / "captions" / "cap.rc2.val.json"
    path.write_text(mangle(path.read_text()))
    capsys.readouterr()
    assert cli("eval", root, tmp_path) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_a_missing_split_names_the_splits_there(tmp_path, capsys):
    root = write_cirr(tmp_path / "cirr")
    capsys.readouterr()
    assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes_cirr", "--dataset_root", str(root),
                 "--task", "composed_retrieval", "--orchestrator", "local", "--quiet", "--output_dir",
                 str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]) != 0
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r".*captions/cap.rc2.test.json is missing \(splits there: val\)", err), err
