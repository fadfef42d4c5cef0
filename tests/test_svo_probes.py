"""SVO-Probes on image_caption_selection: a tiny copy of its layout (svo_probes.csv + images/<id>.<ext>), scored
through the registry with the bundled model, equal to a direct re-implementation of the rule contrastive models are
scored with on it (Bugliarello et al. 2023, e-bug/fine-grained-evals: models/CLIP/SVO.py's similarities, then
notebooks/SVO.ipynb's strict ``pos > neg`` per row and its subj / verb / obj split) on the same cached embeddings;
hand cases with ties; bad input named in one line."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import default_task, open_dataset
from clipcache.tasks.datasets.compositionality.svo_probes import SvoProbesSelection, negative_type
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.selection import selection_metrics, selection_outcomes


def svo_row_right(text, pos, neg):
    """models/CLIP/SVO.py: the sentence twice against [positive, negative], ``text @ image.T`` in numpy, the
    diagonal; notebooks/SVO.ipynb: the row is right when ``score_p > score_n``."""
    similarity = np.stack([text, text]) @ np.stack([pos, neg]).T
    return bool(similarity[0, 0] > similarity[1, 1])


def svo_notebook(rights, flags):
    """notebooks/SVO.ipynb's table: per row its type (subj_neg, elif verb_neg, else obj), np.mean per type."""
    per_type = {"subj": [], "verb": [], "obj": []}
    for right, (subj, verb, _obj) in zip(rights, flags, strict=True):
        per_type["subj" if subj else "verb" if verb else "obj"].append(right)
    return {k: float(np.mean(v)) for k, v in per_type.items() if v}, float(np.mean(rights))


def unit(rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.norm(dim=-1, keepdim=True)


def test_rule_by_hand_a_tie_is_a_miss():
    # items: [positive, negative] images against one sentence. 0: the positive is closer; 1: the negative is;
    # 2: the two images are the same vector (an exact tie: a miss, though the first index would give it to the
    # positive); 3: a near tie the positive wins
    images = unit([[[1, 0], [0, 1]], [[1, 0], [0, 1]], [[0.6, 0.8], [0.6, 0.8]], [[1, 0.01], [1, 0.02]]])
    texts = unit([[[1, 0.2]], [[0.2, 1]], [[1, 1]], [[1, 0]]])
    expected = [svo_row_right(texts[i, 0].numpy(), images[i, 0].numpy(), images[i, 1].numpy()) for i in range(4)]
    assert expected == [True, False, False, True]
    strict = selection_outcomes(images, texts, strict=True)
    assert strict["image_right"].tolist() == expected
    assert selection_outcomes(images, texts)["image_right"].tolist() == [True, False, True, True]  # not strict
    assert strict["text_right"].all()  # one caption: no rival on the text side
    assert strict["image_tied"].tolist() == [False, False, True, False]
    assert strict["image_margin"][2] == 0 and strict["image_margin"][1] < 0 < strict["image_margin"][0]
    metrics, tied = selection_metrics(strict)
    assert metrics == {"image_acc": 0.5, "text_acc": 1.0, "acc": 0.5} and tied == 1


def test_negative_type_and_group_metrics_by_hand():
    assert [negative_type(s, v) for s, v in ((True, False), (False, True), (False, False), (True, True))] == \
        ["subj", "verb", "obj", "subj"]
    ds = SvoProbesSelection(name="svo_probes", split="test", task="image_caption_selection",
                            item_groups=["verb", "subj", "subj", "verb", "subj"])
    samples = {"image_right": np.array([1, 0, 1, 1, 1], bool), "text_right": np.ones(5, bool),
               "sample_index": np.array([0, 1, 2, 3, 4])}
    metrics = ds.group_metrics(samples)
    assert metrics == {"image_acc:subj": 2 / 3, "image_acc:verb": 1.0}  # no obj row: no obj number
    assert list(metrics) == ["image_acc:subj", "image_acc:verb"]  # the paper's column order
    # an item dropped (an undecodable image) leaves its group's mean
    assert ds.group_metrics({**samples, "image_right": samples["image_right"][[0, 2, 3, 4]],
                             "sample_index": np.array([0, 2, 3, 4])})["image_acc:subj"] == 1.0


# --- a tiny copy of the layout ---------------------------------------------------------------------------------------

HEADER = ["index", "sentence", "pos_triplet", "neg_triplet", "subj_neg", "verb_neg", "obj_neg", "pos_url", "neg_url",
          "pos_image_id", "neg_image_id"]
EXTENSIONS = (".jpg", ".jpeg", ".png")
# (sentence's shape, positive id, negative id, subj_neg, verb_neg, obj_neg); ids 1000 + shape index, 2000 the same
# file as 1002 under another id
ROWS = [
    (0, 1000, 1001, True, False, False),
    (1, 1001, 1002, False, True, False),
    (2, 1002, 1003, False, False, True),
    (3, 1003, 1003, True, False, False),   # the same image twice: an exact tie, a miss
    (2, 1002, 2000, False, True, False),   # the same picture under two ids: a tie too
    (4, 1005, 1004, False, False, True),   # the sentence of the "negative": a miss for a good model
    (5, 1004, 1005, True, False, False),   # likewise
    (6, 1006, 1007, True, True, False),    # two flags: the reference calls it subj
    (7, 1007, 1000, False, False, False),  # no flag: the reference calls it obj
    (0, 1000, 1006, False, True, True),    # verb
    (1, 1001, 1003, True, False, False),
    (3, 1003, 1001, False, False, True),
]


def flag_text(value, k):
    return ["True", "TRUE", "1"][k % 3] if value else ["False", "false", "0"][k % 3]


def write_svo(root, rows=ROWS):
    from clipcache.tasks.datasets import shapes as generated

    shapes = generated.load_shapes("fixture", "zeroshot_retrieval", "test", 8)
    (root / "images").mkdir(parents=True)
    for i in range(8):
        shapes.load_image(i).save(root / "images" / f"{1000 + i}{EXTENSIONS[i % 3]}")
    (root / "images" / "2000.png").write_bytes((root / "images" / "1002.png").read_bytes())
    with open(root / "svo_probes.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for k, (s, pos, neg, *flags) in enumerate(rows):
            writer.writerow([500 + k, shapes.captions[s][0], "a,b,c", "['a,b,d', 'a,b,e']",
                             *(flag_text(v, k) for v in flags), f"https://example.com/{pos}.jpg",
                             f"https://example.com/{neg}.jpg", pos, neg])
    return [shapes.captions[s][0] for s, *_ in rows]


def run_clipcache(tmp_path, root):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    assert default_task("svo_probes", str(root)) == "image_caption_selection"
    return evaluate_one("image_caption_selection", session, DataSource("svo_probes", str(root)),
                        EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(4, 2))


def cached_vectors(store):
    """The cache's image vectors by dataset image index, and each item's sentence vector (float32, as stored)."""
    entries = [store.open(k) for k in store.keys()]
    [captions] = [e for e in entries if e.meta.get("captions")]
    [images] = [e for e in entries if not e.meta.get("captions")]
    image_rows = images.array("embeddings").astype(np.float32)
    by_image = {int(p): image_rows[r] for r, p in enumerate(images.array("position"))}
    text_rows = captions.array("embeddings").astype(np.float32)
    by_item = {int(i): text_rows[r] for r, i in zip(captions.array("caption_row"), captions.array("caption_sample"),
                                                     strict=True)}
    return by_image, by_item


def test_svo_probes_equals_the_reference_rule_on_the_cached_embeddings(tmp_path, tiny_model_dir):
    root = tmp_path / "svo"
    sentences = write_svo(root)
    scored = run_clipcache(tmp_path, root)
    ds = open_dataset("svo_probes", str(root), "test", None)
    assert ds.n_items == len(ROWS) and len(ds) == 9  # each image once (eight ids and the copy under 2000)
    assert ds.captions == [[s] for s in sentences] and ds.item_keys[:2] == ["500", "501"]
    assert [p.name for p in ds.sources][:3] == ["1000.jpg", "1001.jpeg", "1002.png"]

    by_image, by_item = cached_vectors(EmbeddingStore(tmp_path / "cache"))
    rights = [svo_row_right(by_item[i], *(by_image[int(j)] for j in ds.item_images[i])) for i in range(ds.n_items)]
    per_type, overall = svo_notebook(rights, [r[3:] for r in ROWS])
    assert not rights[3] and not rights[4]  # the ties are misses
    assert np.array_equal(by_image[int(ds.item_images[4][0])], by_image[int(ds.item_images[4][1])])  # a real tie
    assert 0 < overall < 1 and sum(rights) >= 6  # a trained model: mostly right, but not on the swapped rows

    assert {k: v for k, v in scored.metrics.items() if k.startswith("image_acc:")} == \
        {f"image_acc:{k}": v for k, v in per_type.items()}
    assert scored.metrics["image_acc"] == pytest.approx(overall, rel=1e-6)  # a float32 mean
    assert scored.metrics["acc"] == scored.metrics["image_acc"] and scored.metrics["text_acc"] == 1.0
    assert scored.n_samples == len(ROWS) and "macro_acc" not in scored.metrics


def test_limit_keeps_the_first_rows(tmp_path):
    root = tmp_path / "svo"
    write_svo(root)
    ds = open_dataset("svo_probes", str(root), "test", 3)
    assert ds.n_items == 3 and len(ds) == 4 and ds.item_groups == ["subj", "verb", "obj"]


def test_bad_input_is_named(tmp_path):
    root = tmp_path / "svo"
    with pytest.raises(DatasetError, match=r"svo_probes.csv not found \(SVO-Probes'"):
        open_dataset("svo_probes", str(root), "test", None)
    write_svo(root, ROWS[:3] + [(4, 1004, 1234, True, False, False)])
    with pytest.raises(DatasetError, match=r"line 5 \(data row 3\): image 1234 \(neg_image_id\) not found as "
                                           r".*images/1234\.jpg\|\.jpeg\|\.png"):
        open_dataset("svo_probes", str(root), "test", None)
    assert open_dataset("svo_probes", str(root), "test", 3).n_items == 3  # rows past the limit are not read

    table = root / "svo_probes.csv"
    lines = table.read_text().splitlines()
    table.write_text("\n".join([lines[0], lines[1].replace(",True,", ",yes,", 1)]) + "\n")
    with pytest.raises(DatasetError, match=r"line 2 \(data row 0\): expected a sentence, integer pos_image_id"):
        open_dataset("svo_probes", str(root), "test", None)
    table.write_text("\n".join([lines[0].replace("verb_neg", "verb"), lines[1]]) + "\n")
    with pytest.raises(DatasetError, match=r"svo_probes.csv: no column verb_neg"):
        open_dataset("svo_probes", str(root), "test", None)
    table.write_text(lines[0] + "\n")
    with pytest.raises(DatasetError, match="no items"):
        open_dataset("svo_probes", str(root), "test", None)
    with pytest.raises(DatasetError, match="splits"):
        open_dataset("svo_probes", str(root), "train", None)
    with pytest.raises(DatasetError, match="needs --dataset_root"):
        open_dataset("svo_probes", None, "test", None)
