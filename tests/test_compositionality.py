"""ARO (VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order), VALSE and MMVP-VLM on image_caption_selection: the caption
order and tie rule on hand-computed cases, ARO's macro accuracy, the default rule unchanged, and tiny copies of the
original layouts scored equal to a direct re-implementation of each reference's rule on the same model."""

from __future__ import annotations

import json

import numpy as np
import open_clip
import pandas as pd
import pytest
import torch

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import default_task, open_dataset
from clipcache.tasks.datasets.compositionality.compositionality import facts
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.selection import grouped_accuracy, selection_metrics, selection_outcomes


def unit(rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.norm(dim=-1, keepdim=True)


def test_right_caption_second_makes_a_tie_a_miss():
    # captions [false, true] with targets (1,): item 0 the true caption closer, item 1 the false one, item 2 an exact
    # tie: ARO's argmax keeps index 0 (the false caption), VALSE's strict caption > foil fails: a miss both ways
    images = unit([[[1, 0]], [[1, 0]], [[1, 1]]])
    texts = unit([[[0, 1], [1, 0.1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]]])
    out = selection_outcomes(images, texts, targets=(1,))
    assert out["text_right"].tolist() == [True, False, False]
    assert out["text_tied"].tolist() == [False, False, True]
    assert out["image_right"].all()  # one image: every caption's best image is it
    metrics, tied = selection_metrics(out)
    assert metrics["text_acc"] == metrics["acc"] == pytest.approx(1 / 3) and tied == 1
    # the same items with the right caption first (SugarCrepe's order, COCO-Order's): the tie is a hit
    first = selection_outcomes(images, texts.flip(1))
    assert first["text_right"].tolist() == [True, False, True]
    # the margin is the right caption's similarity less the other's
    assert out["text_margin"][0] == pytest.approx(float(images[0, 0] @ texts[0, 1] - images[0, 0] @ texts[0, 0]))


def test_default_targets_unchanged():
    g = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(50, 2, 8, generator=g), dim=-1)
    texts = torch.nn.functional.normalize(torch.randn(50, 2, 8, generator=g), dim=-1)
    texts[3, 1] = texts[3, 0]  # a tie
    plain, explicit = selection_outcomes(images, texts), selection_outcomes(images, texts, targets=(0, 1))
    for name in plain:
        np.testing.assert_array_equal(plain[name], explicit[name])
    # swapping the captions and naming them swapped gives the same outcomes where nothing ties
    swapped = selection_outcomes(images, texts.flip(1), targets=(1, 0))
    untied = ~(plain["text_tied"] | plain["image_tied"])
    np.testing.assert_array_equal(plain["text_right"][untied], swapped["text_right"][untied])
    np.testing.assert_array_equal(plain["image_right"][untied], swapped["image_right"][untied])


def test_grouped_accuracy_by_hand():
    right = np.array([1, 0, 1, 1, 0, 1, 1], dtype=bool)
    groups = ["on", "on", "by", "left of", "left of", "left of", "under"]
    # on 1/2, by 1 (left out: symmetric), left of 2/3, under 1 -> (0.5 + 2/3 + 1) / 3
    assert grouped_accuracy(right, groups, exclude=frozenset({"by"})) == pytest.approx((0.5 + 2 / 3 + 1) / 3)
    assert grouped_accuracy(right, groups, min_count=2) == pytest.approx((0.5 + 2 / 3) / 2)
    assert np.isnan(grouped_accuracy(right, groups, min_count=9))
    assert "by" in facts()["aro_vg_relation_excluded"] and facts()["aro_vg_attribution_min_count"] == 25


# --- tiny copies of the original layouts ---------------------------------------------------------------------------

def shapes(n):
    from clipcache.tasks.datasets import shapes as generated

    return generated.load_shapes("fixture", "zeroshot_retrieval", "test", n)


def write_vg(root, relation=True, n=10):
    """ARO's root_dir: images/ and visual_genome_<relation|attribution>.json, boxes inside 64x64 images; one item
    with equal captions (an exact tie) and images shared by several items, as the real files have."""
    ds = shapes(4)
    (root / "images").mkdir(parents=True)
    for i in range(4):
        ds.load_image(i).save(root / "images" / f"{i}.jpg", quality=95)
    items = []
    groups = ["on", "by", "left of", "on", "under"] if relation else [["red", "blue"], ["small", "big"]]
    for k in range(n):
        i = k % 4
        item = {"image_id": str(i), "image_path": f"{i}.jpg", "bbox_x": 4 * (k % 3), "bbox_y": 2 * (k % 2),
                "bbox_w": 50 + k % 5, "bbox_h": 48 + 2 * (k % 4), "true_caption": ds.captions[i][0],
                "false_caption": ds.captions[(i + 1) % 4][k % len(ds.captions[(i + 1) % 4])]}
        if k == 0:
            item["false_caption"] = item["true_caption"]
        item["relation_name" if relation else "attributes"] = groups[k % len(groups)]
        items.append(item)
    name = "visual_genome_relation.json" if relation else "visual_genome_attribution.json"
    (root / name).write_text(json.dumps(items))
    return root, items


def reference_model(model_dir):
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{model_dir}", device="cpu")
    return model.eval(), preprocess, open_clip.get_tokenizer(f"local-dir:{model_dir}")


def reference_scores(model_dir, images, caption_options):
    """ARO's CLIPWrapper.get_retrieval_scores_batched: N x 1 x L scores of L2-normalised numpy embeddings."""
    model, preprocess, tokenizer = reference_model(model_dir)
    with torch.no_grad():
        im = model.encode_image(torch.stack([preprocess(i) for i in images])).numpy()
        flat = [c for options in caption_options for c in options]
        tx = model.encode_text(tokenizer(flat)).numpy()
    im = im / np.linalg.norm(im, axis=1, keepdims=True)
    tx = (tx / np.linalg.norm(tx, axis=1, keepdims=True)).reshape(len(images), len(caption_options[0]), -1)
    return np.einsum("nkd,nld->nkl", im[:, None, :], tx)


def run_clipcache(tmp_path, name, root):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    assert default_task(name, str(root)) == "image_caption_selection"
    return evaluate_one("image_caption_selection", session, DataSource(name, str(root)),
                        EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(8, 2))


def test_vg_relation_equals_aro(tmp_path, tiny_model_dir):
    from PIL import Image

    root, items = write_vg(tmp_path / "aro")
    crops = [Image.open(root / "images" / t["image_path"]).convert("RGB").crop(
        (t["bbox_x"], t["bbox_y"], t["bbox_x"] + t["bbox_w"], t["bbox_y"] + t["bbox_h"])) for t in items]
    scores = reference_scores(tiny_model_dir, crops, [[t["false_caption"], t["true_caption"]] for t in items])
    # VG_Relation.evaluate_scores, then the notebook's macro accuracy without the symmetric relations
    correct = np.argmax(np.squeeze(scores, axis=1), axis=-1) == 1
    relations = np.array([t["relation_name"] for t in items])
    records = pd.DataFrame([{"Relation": r, "Accuracy": correct[relations == r].mean()} for r in np.unique(relations)])
    macro = records[~records.Relation.isin(facts()["aro_vg_relation_excluded"])].Accuracy.mean()
    assert not correct[0]  # the tied item is a miss

    scored = run_clipcache(tmp_path, "aro/vg_relation", root)
    assert scored.metrics["macro_acc"] == macro and scored.n_samples == len(items)
    assert scored.metrics["acc"] == pytest.approx(np.mean(correct)) == scored.metrics["text_acc"]
    ds = open_dataset("aro/vg_relation", str(root), "test", None)
    assert len(ds) == len(items)  # every box differs: one image each
    assert [np.asarray(ds.load_image(i)).tolist() for i in (0, 5)] == [np.asarray(crops[i]).tolist() for i in (0, 5)]


def test_vg_attribution_macro_over_pairs_with_25_items(tmp_path, tiny_model_dir):
    from PIL import Image

    root, items = write_vg(tmp_path / "aro", relation=False, n=30)  # red_blue 15, small_big 15: both under 25
    scored = run_clipcache(tmp_path, "aro/vg_attribution", root)
    assert np.isnan(scored.metrics["macro_acc"])  # ARO's records would be empty
    for t in items[:27]:
        t["attributes"] = ["red", "blue"]
    (root / "visual_genome_attribution.json").write_text(json.dumps(items))
    crops = [Image.open(root / "images" / t["image_path"]).convert("RGB").crop(
        (t["bbox_x"], t["bbox_y"], t["bbox_x"] + t["bbox_w"], t["bbox_y"] + t["bbox_h"])) for t in items]
    scores = reference_scores(tiny_model_dir, crops, [[t["false_caption"], t["true_caption"]] for t in items])
    correct = np.argmax(np.squeeze(scores, axis=1), axis=-1) == 1
    pairs = np.array([f"{t['attributes'][0]}_{t['attributes'][1]}" for t in items])
    records = [correct[pairs == p].mean() for p in np.unique(pairs) if (pairs == p).sum() >= 25]
    scored = run_clipcache(tmp_path, "aro/vg_attribution", root)
    assert scored.metrics["macro_acc"] == pd.DataFrame({"Accuracy": records}).Accuracy.mean()
    assert scored.metrics["acc"] == pytest.approx(np.mean(correct))


@pytest.mark.parametrize("name, folder", [("aro/coco_order", "val2014"), ("aro/flickr30k_order", "flickr30k-images")])
def test_order_sets_equal_aro(tmp_path, tiny_model_dir, name, folder):
    from PIL import Image

    ds = shapes(3)
    root = tmp_path / "root"
    (root / folder).mkdir(parents=True)
    cases = []
    for i in range(3):
        ds.load_image(i).save(root / folder / f"{i}.jpg", quality=95)
        for caption in ds.captions[i][:2]:  # one test case per caption, four perturbations after it
            words = caption.split(" ")
            options = [caption, " ".join(reversed(words)), " ".join(sorted(words)), " ".join(words[1:] + words[:1]),
                       caption if i == 1 else " ".join(sorted(words, reverse=True))]  # i == 1: a tie with the caption
            cases.append({"image": f"{folder}/{i}.jpg", "caption_options": options})
    (root / f"{name.split('/')[1]}_test.json").write_text(json.dumps(cases))
    images = [Image.open(root / c["image"]).convert("RGB") for c in cases]
    scores = reference_scores(tiny_model_dir, images, [c["caption_options"] for c in cases])
    precision = np.mean(np.argmax(np.squeeze(scores, axis=1), axis=-1) == 0)  # ARO's Precision@1; a tie counts
    scored = run_clipcache(tmp_path, name, root)
    assert scored.metrics["acc"] == pytest.approx(precision) and scored.n_samples == 6
    assert len(open_dataset(name, str(root), "test", None)) == 3  # each image once for its two test cases


def test_valse_pairwise_accuracy(tmp_path, tiny_model_dir):
    from PIL import Image

    ds = shapes(6)
    root = tmp_path / "valse"
    (root / "images").mkdir(parents=True)
    items = {}
    for i in range(6):
        ds.load_image(i).save(root / "images" / f"v7w_{i}.jpg", quality=95)
        foil = ds.captions[i][0] if i == 2 else ds.captions[(i + 2) % 6][0]  # i == 2: foil == caption, a tie
        items[f"existence_visual7w_{i}"] = {"dataset": "visual7w", "image_file": f"v7w_{i}.jpg",
                                            "caption": ds.captions[i][0], "foil": foil,
                                            "mturk": {"foil": 0, "caption": 1 if i == 4 else 3, "other": 0}}
    (root / "existence.json").write_text(json.dumps(items))
    valid = [v for v in items.values() if v["mturk"]["caption"] >= 2]  # VALSE's valid set
    images = [Image.open(root / "images" / v["image_file"]).convert("RGB") for v in valid]
    scores = reference_scores(tiny_model_dir, images, [[v["caption"], v["foil"]] for v in valid])[:, 0]
    pairwise = np.mean(scores[:, 0] > scores[:, 1])  # acc_r: the caption strictly above the foil
    scored = run_clipcache(tmp_path, "valse/existence", root)
    assert scored.metrics["acc"] == pytest.approx(pairwise) and scored.n_samples == 5
    assert scores[2, 0] == scores[2, 1]  # the tied item (i == 2): a miss for both


def test_bad_layouts_are_named(tmp_path):
    with pytest.raises(DatasetError, match="visual_genome_relation.json not found"):
        open_dataset("aro/vg_relation", str(tmp_path), "test", None)
    with pytest.raises(DatasetError, match="coco_order_test.json not found"):
        open_dataset("aro/coco_order", str(tmp_path), "test", None)
    root, items = write_vg(tmp_path / "aro")
    items[3]["bbox_w"] = "wide"
    (root / "visual_genome_relation.json").write_text(json.dumps(items))
    with pytest.raises(DatasetError, match="item 3: expected"):
        open_dataset("aro/vg_relation", str(root), "test", None)
    with pytest.raises(DatasetError, match="only|splits"):
        open_dataset("aro/vg_relation", str(root), "train", None)
    (tmp_path / "v" / "images").mkdir(parents=True)
    (tmp_path / "v" / "plurals.json").write_text(json.dumps({"a": {"image_file": "x.jpg", "caption": "c",
                                                                   "foil": "f", "mturk": {"caption": 3}}}))
    with pytest.raises(DatasetError, match="x.jpg not found"):
        open_dataset("valse/plurals", str(tmp_path / "v"), "test", None)


def test_mmvp_vlm_pair_accuracy(tmp_path, tiny_model_dir):
    from PIL import Image

    ds = shapes(8)
    root = tmp_path / "MMVP_VLM"
    rows = [["Question ID", "Type", "Statement"]]
    for pair in range(4):
        category = "Color and Appearance" if pair < 2 else "Texts"
        (root / "MLLM_VLM Images" / category).mkdir(parents=True, exist_ok=True)
        for q in (2 * pair + 1, 2 * pair + 2):
            # pair 3: the same picture twice, an exact tie: MMVP gives it to image 2 (P(image 1) > 0.5 fails)
            ds.load_image(6 if pair == 3 else q - 1).save(root / "MLLM_VLM Images" / category / f"{q}.jpg", quality=95)
            rows.append([str(q), category, ds.captions[q - 1][0]])
    rows.append(["9", "Texts", "an unpaired last row"])
    (root / "Questions.csv").write_text("\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n")

    model, preprocess, tokenizer = reference_model(tiny_model_dir)
    right = []
    for first, second in zip(rows[1:9:2], rows[2:9:2], strict=True):  # scripts/evaluate_vlm.py, pair by pair
        folder = root / "MLLM_VLM Images" / first[1]
        imgs = torch.stack([preprocess(Image.open(folder / f"{q}.jpg")) for q in (first[0], second[0])])
        with torch.no_grad():
            im = torch.nn.functional.normalize(model.encode_image(imgs), dim=-1)
            preds = []
            for statement in (first[2], second[2]):
                t = torch.nn.functional.normalize(model.encode_text(tokenizer(["a photo of " + statement])), dim=-1)
                probs = (model.logit_scale.exp() * t @ im.t()).softmax(dim=-1).numpy()
                preds.append("img1" if probs[0][0] > 0.5 else "img2")
        gt = ["img1" if int(first[0]) % 2 == 1 else "img2", "img1" if int(second[0]) % 2 == 1 else "img2"]
        right.append(preds == gt)
    assert not right[3]  # the tie: statement 1 wrongly gets image 2
    scored = run_clipcache(tmp_path, "mmvp_vlm", root)
    assert scored.metrics["image_acc"] == pytest.approx(np.mean(right)) and scored.n_samples == 4
