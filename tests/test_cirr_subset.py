"""CIRR's Recall_subset@k (each query ranked within its img_set less its reference image) against a brute-force
implementation of CIRR's rule (full ranking with the reference removed, then filtered to the subset, as CLIP4Cir's
compute_cirr_val_metrics filters it), with exact ties and hand cases; CIRR's "Avg" ((recall@5 + recall_subset@1) /
2); the img_set read from CIRR's files; FashionIQ's average over its three categories as shipped suites."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from test_composed_retrieval import N_IMAGES, N_QUERIES, session

from clipcache import connect
from clipcache.flows.cli import main
from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.tasks.datasets import shapes
from clipcache.tasks.datasets.mieb.composed_layouts import open_composed
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.score.composed_retrieval import composed_ranks
from clipcache.tasks.suites import load_suite


def brute_force_subset(scores: np.ndarray, ids: list[str], reference: int, members: list[int], target: int) -> int:
    """CIRR's rule, written out: the gallery sorted best first (score, then id, descending: the order this task's
    recall@k uses), the reference removed, then only the img_set's members kept; the target's 0-based place, -1 when
    it is no member."""
    order = sorted(range(len(ids)), key=lambda j: (scores[j], ids[j]), reverse=True)
    ranked = [j for j in order if j != reference and j in members]
    return ranked.index(target) if target in ranked else -1


def test_hand_cases_and_ties():
    """Gallery a..f on the unit circle. Query 0 (reference c, members a b c d, target b): a scores above b, so b is
    2nd in the subset, though e and f (no members) also outrank it. Query 1 (target d, members c d e): d ties e and e
    wins by id, so d is 2nd and recall_subset@1 is decided by the tie. Query 2: the target is no member."""
    gallery = np.array([[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1], [0, 1], [0.99, 0.141]], np.float32)
    ids = list("abcdef")
    image = np.array([[1, 0], [0, 1], [1, 0]], np.float32)
    text = np.zeros_like(image)
    targets = [np.array([1]), np.array([3]), np.array([1])]
    subsets = [np.array([0, 1, 3]), np.array([2, 3, 4]), np.array([0, 2])]
    result = composed_ranks(image, text, gallery, targets, [np.ones(1)] * 3, gallery_ids=ids,
                            excluded=np.array([2, -1, -1]), subsets=subsets)
    subset = result.subset
    assert [r.tolist() for r in subset.ranks] == [[1], [1], [-1]]
    assert subset.recall(1).tolist() == [0, 0, 0] and subset.recall(2).tolist() == [1, 1, 0]
    assert subset.tied(1).tolist() == [False, True, False] and subset.tied(2).tolist() == [False] * 3
    assert [r.tolist() for r in result.ranked.ranks] == [[2], [1], [2]]  # the full ranking, for contrast


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_to_brute_force_cirr_rule_with_ties(seed):
    rng = np.random.default_rng(seed)
    n_gallery, n_queries, dim = 40, 30, 6
    gallery = rng.integers(-2, 3, size=(n_gallery, dim)).astype(np.float32)
    gallery[1::4] = gallery[0::4]  # exact duplicates: exactly tied scores
    gallery[np.abs(gallery).sum(1) == 0, 0] = 1
    ids = [f"dev-{rng.integers(1000)}-{j}-img{j % 2}" for j in range(n_gallery)]
    image = rng.normal(size=(n_queries, dim)).astype(np.float32)
    text = rng.normal(size=(n_queries, dim)).astype(np.float32)
    image[::3] = gallery[rng.integers(n_gallery, size=10)]  # some queries tie their own candidates exactly
    text[::3] = 0
    references = rng.integers(n_gallery, size=n_queries)
    members, targets, subsets = [], [], []
    for q in range(n_queries):
        twin = 4 * int(rng.integers(n_gallery // 4))  # a member and its exact duplicate: tied within the subset
        others = [int(j) for j in rng.permutation(n_gallery) if j not in (references[q], twin, twin + 1)][:3]
        pool = [int(references[q]), twin + q % 2, twin + 1 - q % 2, *others]  # six members, the reference among them
        if references[q] in (twin, twin + 1):
            pool = [int(references[q]), *[int(j) for j in rng.permutation(n_gallery) if j != references[q]][:5]]
        members.append(pool)
        targets.append(np.array([pool[1] if q % 7 else int(rng.integers(n_gallery))]))  # a few are no member
        subsets.append(np.array([m for m in pool if m != references[q]]))
    result = composed_ranks(image, text, gallery, targets, [np.ones(1)] * n_queries, gallery_ids=ids,
                            excluded=references, subsets=subsets, block_bytes=2_000)  # several blocks
    scores = (torch.nn.functional.normalize(torch.from_numpy(image + text), dim=1)
              @ torch.nn.functional.normalize(torch.from_numpy(gallery), dim=1).T).numpy()
    expected = [brute_force_subset(scores[q], ids, int(references[q]), members[q], int(targets[q][0]))
                for q in range(n_queries)]
    assert [int(r[0]) for r in result.subset.ranks] == expected
    for k in (1, 2, 3):
        assert result.subset.recall(k).tolist() == [float(0 <= e < k) for e in expected]
    assert result.subset.tied(1).any()  # the duplicates did tie somewhere


def cirr_records():
    """CIRR val records over shapes images, each with an img_set of six members: the reference, the target and four
    others (as CIRR's files give them)."""
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", N_IMAGES)
    labels = [int(x) for x in ds.labels]
    names = [f"dev-{i}-0-img0" for i in range(N_IMAGES)]
    records = []
    for q in range(N_QUERIES):
        reference, target = q, (q * 7 + 3) % N_IMAGES
        others = [j for j in ((q * 5 + 1 + i * 3) % N_IMAGES for i in range(8)) if j not in (reference, target)][:4]
        members = [names[j] for j in (others[0], target, others[1], reference, *others[2:])]
        records.append({"pairid": 100 + q, "reference": names[reference], "target_hard": names[target],
                        "caption": f"make it a {shapes.CLASSNAMES[labels[target]]}",
                        "target_soft": {names[target]: 1.0},
                        "img_set": {"id": q // 3, "members": members, "reference_rank": 3, "target_rank": 1}})
    return ds, names, records


def write_cirr(root, records=None):
    ds, names, made = cirr_records()
    (root / "dev").mkdir(parents=True)
    for i, name in enumerate(names):
        ds.load_image(i).save(root / "dev" / f"{name}.png")
    (root / "captions").mkdir()
    (root / "image_splits").mkdir()
    (root / "captions" / "cap.rc2.val.json").write_text(json.dumps(made if records is None else records))
    (root / "image_splits" / "split.rc2.val.json").write_text(json.dumps({n: f"./dev/{n}.png" for n in names}))
    return root


def test_cirr_files_give_recall_subset_and_cirrs_avg(tmp_path):
    root = write_cirr(tmp_path / "cirr")
    model_session, memo = session()
    store = EmbeddingStore(tmp_path / "cache")
    scored = evaluate_one("composed_retrieval", model_session, DataSource("shapes_cirr", str(root), split="val"),
                          store, memo, encode=EncodeSettings(8, 0))
    data = open_composed("shapes_cirr", root, "val", None)
    _, names, records = cirr_records()
    assert [m.tolist() for m in data.subsets] == [[names.index(n) for n in r["img_set"]["members"]] for r in records]
    # brute force from the cache: raw features fused, cosine in float32 as the task scores them
    found = {store.open(k).attrs["key_fields"]["role"]: store.open(k) for k in store.keys()}
    image, text = found["composed_image"], found["modifier_text"]
    fused = torch.from_numpy(image.raw_embeddings("test")[data.query_image] +
                             text.raw_embeddings("test")[data.query_text])
    scores = (torch.nn.functional.normalize(fused, dim=1)
              @ torch.nn.functional.normalize(torch.from_numpy(image.embeddings()[data.gallery]), dim=1).T).numpy()
    expected = np.array([brute_force_subset(scores[q], data.gallery_ids, int(data.reference[q]),
                                            data.subsets[q].tolist(), int(data.targets[q][0]))
                         for q in range(N_QUERIES)])
    assert (expected >= 0).all() and len(set(expected.tolist())) > 1
    for k in (1, 2, 3):
        assert scored.metrics[f"recall_subset@{k}"] == np.mean(expected < k)
    assert scored.metrics["cirr_avg"] == pytest.approx((scored.metrics["recall@5"] +
                                                        scored.metrics["recall_subset@1"]) / 2, abs=1e-12)
    assert scored.evidence.intervals["recall_subset@1"] and scored.evidence.intervals["cirr_avg"]
    [rows] = [part for part in scored.evidence.more if part.unit == "subset_query"]
    assert rows.columns["rank"].tolist() == (expected + 1).tolist() and rows.keys == [str(r["pairid"])
                                                                                      for r in records]
    # the subset never holds the reference, whatever reference_image says for the full ranking
    kept = evaluate_one("composed_retrieval", model_session, DataSource("shapes_cirr", str(root), split="val"),
                        store, memo, encode=EncodeSettings(8, 0), options={"reference_image": "keep"})
    assert {k: kept.metrics[k] for k in ("recall_subset@1", "recall_subset@2", "recall_subset@3")} == \
        {k: scored.metrics[k] for k in ("recall_subset@1", "recall_subset@2", "recall_subset@3")}


@pytest.mark.parametrize("mangle, message", [
    (lambda r: [{**r[0], "img_set": {"id": 1, "members": ["dev-0-0-img0", "nope"]}}, *r[1:]],
     r"cap.rc2.val.json record 0: img_set member 'nope' is not in .*split.rc2.val.json"),
    (lambda r: [{**r[0], "img_set": ["dev-0-0-img0"]}, *r[1:]],
     r"cap.rc2.val.json record 0: img_set must be an object whose 'members' is a list of image names"),
    (lambda r: [r[0], {k: v for k, v in r[1].items() if k != "img_set"}, *r[2:]],
     r"cap.rc2.val.json record 1: no img_set, where the records before it have one"),
])
def test_a_malformed_img_set_is_one_line(tmp_path, capsys, mangle, message):
    _, _, records = cirr_records()
    root = write_cirr(tmp_path / "cirr", mangle(records))
    capsys.readouterr()
    code = main(["eval", "--model", "tiny-shapes-clip", "--dataset", "shapes_cirr", "--dataset_root", str(root),
                 "--split", "val", "--orchestrator", "local", "--quiet", "--output_dir", str(tmp_path / "out"),
                 "--cache_dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and re.search(message, err), err


def test_fashioniq_average_over_its_three_categories(tmp_path, capsys):
    """The shipped suites fashioniq_r10 / fashioniq_r50 run the three categories from one folder and average their
    recall@10 / recall@50 (FashionIQ's reported average)."""
    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", N_IMAGES)
    root = tmp_path / "fiq"
    (root / "images").mkdir(parents=True)
    (root / "captions").mkdir()
    (root / "image_splits").mkdir()
    ids = [f"B00{i:04d}" for i in range(N_IMAGES)]
    for i, image_id in enumerate(ids):
        ds.load_image(i).save(root / "images" / f"{image_id}.png")
    for c, category in enumerate(("dress", "shirt", "toptee")):
        gallery = ids[c:]  # each category its own gallery and queries
        targets = [gallery[(q * (5 + c) + 3) % len(gallery)] for q in range(8 + c)]
        named = targets if c < 2 else targets[1:] + targets[:1]  # toptee's captions name another target's shape
        captions = [{"candidate": gallery[q], "target": t, "captions": [
            f"is a {shapes.CLASSNAMES[int(ds.labels[ids.index(n)])]}", "looks different"]}
            for q, (t, n) in enumerate(zip(targets, named, strict=True))]
        (root / "captions" / f"cap.{category}.val.json").write_text(json.dumps(captions))
        (root / "image_splits" / f"split.{category}.val.json").write_text(json.dumps(gallery))
    out = tmp_path / "out"
    assert main(["eval", "--model", "tiny-shapes-clip", "--suite", "fashioniq_r10", "--dataset_root", str(root),
                 "--split", "val", "--orchestrator", "local", "--quiet", "--output_dir", str(out),
                 "--cache_dir", str(tmp_path / "cache")]) == 0
    con = connect(str(out))
    per = {d: {k: v for _, k, v in rows} for d in ("fashioniq_dress", "fashioniq_shirt", "fashioniq_toptee")
           for rows in [con.execute("SELECT dataset, k, value FROM metrics WHERE metric = 'recall' AND dataset = ?",
                                    [d]).fetchall()]}
    assert len({per[d][10] for d in per}) > 1 or len({per[d][50] for d in per}) > 1
    for k in (10, 50):
        capsys.readouterr()
        assert main(["suite", "score", f"fashioniq_r{k}", "--output_dir", str(out), "--format", "json",
                     "--bootstrap", "0"]) == 0
        [model] = json.loads(capsys.readouterr().out)
        assert model["score"] == pytest.approx(np.mean([per[d][k] for d in per]), abs=1e-12)
        assert [e.dataset for e in load_suite(f"fashioniq_r{k}").datasets] == list(per)
