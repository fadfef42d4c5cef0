"""COLA, CREPE and VL-CheckList on image_caption_selection: tiny copies of their original layouts, scored through the
registry with the bundled model, equal to a direct re-implementation of each reference's rule (COLA's
ColaMultiObjAcc, CREPE's get_one2many_rank recall@1, VL-CheckList's ITC comparison and radar averages) on
embeddings computed with open_clip directly; hand-computed ties; bad input named in one line."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets import default_task, open_dataset
from clipcache.tasks.datasets.compositionality.compositionality_more import facts
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one, metric_catalog
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.metrics import split_metric_name
from clipcache.tasks.score.selection import selection_metrics, selection_outcomes


def unit(rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.norm(dim=-1, keepdim=True)


def cola_acc(preds):  # COLA's scripts/eval.py ColaMultiObjAcc, on a 2 x 2 image-by-caption matrix
    return bool(preds[0, 0] > preds[1, 0] and preds[1, 1] > preds[0, 1])


def test_strict_rule_by_hand():
    # item 0: both captions closer to their own image; item 1: caption 0 ties between the images (the first-index
    # rule gives it to image 0, COLA's strict > does not); item 2: caption 1 ties; item 3: each caption picks the
    # other image
    images = unit([[[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], [[0, 1], [1, 0.5]]])
    texts = unit([[[1, 0.2], [0.2, 1]], [[1, 1], [0, 1]], [[1, 0], [1, 1]], [[1, 0], [0, 1]]])
    strict = selection_outcomes(images, texts, strict=True)
    expected = [cola_acc((images[i] @ texts[i].t()).numpy()) for i in range(4)]
    assert strict["image_right"].tolist() == expected == [True, False, False, False]
    first = selection_outcomes(images, texts)
    assert first["image_right"].tolist() == [True, True, False, False]  # the tie of item 1 went to image 0
    assert strict["image_tied"].tolist() == first["image_tied"].tolist() == [False, True, True, False]
    assert strict["text_right"].tolist() == first["text_right"].tolist() == [True, True, True, False]
    metrics, tied = selection_metrics(strict)
    assert metrics["image_acc"] == pytest.approx(0.25) and tied == 2
    # one caption per item (no rival): strict and first-index agree
    one = selection_outcomes(unit([[[1, 0], [0, 1]]]), unit([[[1, 0.1]]]), strict=True)
    assert one["text_right"].tolist() == [True] and one["image_right"].tolist() == [True]


def test_group_metric_names_have_a_definition():
    info, k = split_metric_name("text_acc:complexity_4", metric_catalog())
    assert info.higher_is_better and k is None and "within the named group" in info.definition
    assert split_metric_name("text_acc:Object_Size_large_vg_obj", metric_catalog())[0].name == "text_acc:Object_Size_large_vg_obj"
    with pytest.raises(KeyError):
        split_metric_name("recall:x", metric_catalog())


# --- tiny layouts ----------------------------------------------------------------------------------------------------

def shapes(n):
    from clipcache.tasks.datasets import shapes as generated

    return generated.load_shapes("fixture", "zeroshot_retrieval", "test", n)


def run_clipcache(tmp_path, name, root):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"),
                           amp=False, precision="fp32")
    assert default_task(name, str(root)) == "image_caption_selection"
    return evaluate_one("image_caption_selection", session, DataSource(name, str(root)),
                        EmbeddingStore(tmp_path / "cache"), memo, encode=EncodeSettings(8, 2))


class Reference:
    """open_clip directly: L2-normalised image and text embeddings, one image / text at a time."""

    def __init__(self, model_dir):
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(f"local-dir:{model_dir}", device="cpu")
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(f"local-dir:{model_dir}")

    def images(self, images):
        with torch.no_grad():
            return torch.nn.functional.normalize(self.model.encode_image(torch.stack([self.preprocess(i)
                                                                                      for i in images])), dim=-1)

    def texts(self, texts):
        with torch.no_grad():
            return torch.nn.functional.normalize(self.model.encode_text(self.tokenizer(texts)), dim=-1)


def test_cola_equals_its_rule(tmp_path, tiny_model_dir):
    ds = shapes(6)
    root = tmp_path / "cola"
    (root / "vg_gqa_images").mkdir(parents=True)
    for i in range(6):
        ds.load_image(i).save(root / "vg_gqa_images" / f"{2400000 + i}.jpg", quality=95)
    # the same picture under a second id: an exact tie on the image side of item 3
    (root / "vg_gqa_images" / "2400099.jpg").write_bytes((root / "vg_gqa_images" / "2400002.jpg").read_bytes())
    link = "https://cs-people.bu.edu/array/data/vg_gqa_images/{}.jpg"
    pairs = [(0, 1), (2, 3), (4, 5), (2, 99), (1, 0), (3, 4)]
    entries = [[link.format(2400000 + a), ds.captions[a % 6][0] if a != 99 else ds.captions[3][0],
                link.format(2400000 + b), ds.captions[b % 6][0] if b != 99 else ds.captions[3][0]] for a, b in pairs]
    entries[4][3] = entries[4][1]  # the same caption twice: a tie on the image side too
    (root / "data").mkdir()
    (root / "data" / "COLA_multiobjects_matching_benchmark.json").write_text(json.dumps(entries))

    ref = Reference(tiny_model_dir)
    right = []
    for e in entries:
        im = ref.images([Image.open(root / "vg_gqa_images" / e[k].rsplit("/", 1)[1]).convert("RGB") for k in (0, 2)])
        right.append(cola_acc((im @ ref.texts([e[1], e[3]]).t()).numpy()))
    assert not right[3] and not right[4]  # the ties are misses
    scored = run_clipcache(tmp_path, "cola/multi_objects", root)
    assert scored.metrics["image_acc"] == pytest.approx(np.mean(right)) and scored.n_samples == 6
    ds = open_dataset("cola/multi_objects", str(root), "test", None)
    # each image once; the strict rule (a tie between two different images, which a real encoder cannot be made to
    # produce here, is a miss: test_strict_rule_by_hand)
    assert len(ds) == 7 and ds.strict


CREPE_COLUMNS = ["image_id", "x", "y", "width", "height", "caption", "hard_negs"]


def write_crepe_csv(path, rows, column="hard_negs"):
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*CREPE_COLUMNS[:-1], column])
        writer.writerows(rows)


def crepe_fixture(root, n_rows, column="hard_negs"):
    """VG images split over VG_100K/ and VG_100K_2/; rows of boxes with 1-3 hard negatives (a ragged set), one hard
    negative equal to its caption (a tie)."""
    ds = shapes(6)
    for i in range(6):
        folder = root / ("VG_100K" if i % 2 else "VG_100K_2")
        folder.mkdir(parents=True, exist_ok=True)
        ds.load_image(i).save(folder / f"{100 + i}.jpg", quality=95)

    def row(k):
        i = k % 6
        negatives = [ds.captions[(i + j) % 6][0] for j in range(1, 2 + k % 3)]
        if k == 1:
            negatives[0] = ds.captions[i][0]
        return [100 + i, 3 * (k % 4), 2 * (k % 3), 40 + k % 7, 44 + k % 5, ds.captions[i][0], repr(negatives)]

    return [row(k) for k in range(n_rows)]


def crepe_reference(ref, root, rows):
    """crepe_compo_eval_open_clip.evaluate with batch size 1: rank of the caption (index 0) in argsort, R@1."""
    ranks = []
    for image_id, x, y, w, h, caption, negatives in rows:
        path = next(p for p in (root / "VG_100K" / f"{image_id}.jpg", root / "VG_100K_2" / f"{image_id}.jpg")
                    if p.exists())
        im = ref.images([TF.crop(Image.open(path).convert("RGB"), y, x, h, w)])
        logits = im @ ref.texts([str(caption), *ast.literal_eval(negatives)]).t()  # as CREPE's code reads them
        ranking = torch.argsort(logits, descending=True)
        ranks.append(torch.where(ranking == 0)[1].numpy())
    return np.array(ranks)


def test_crepe_productivity_equals_its_recall_at_1(tmp_path, tiny_model_dir):
    root = tmp_path / "crepe"
    rows = crepe_fixture(root, 18)
    per_file = {}
    for n in facts()["crepe_complexities"]:  # two rows per complexity file
        per_file[n] = rows[2 * (n - 4): 2 * (n - 4) + 2]
        write_crepe_csv(root / "prod_hard_negatives" / "swap" / f"prod_vg_hard_negs_swap_complexity_{n}.csv",
                        per_file[n])
    ref = Reference(tiny_model_dir)
    scored = run_clipcache(tmp_path, "crepe/productivity/swap", root)
    assert crepe_reference(ref, root, rows[1:2])[0] == 0  # the tie goes to the caption
    for n, file_rows in per_file.items():
        assert scored.metrics[f"text_acc:complexity_{n}"] == np.mean(crepe_reference(ref, root, file_rows) < 1)
    assert scored.metrics["text_acc"] == pytest.approx(np.mean(crepe_reference(ref, root, rows) < 1))
    assert scored.n_samples == 18
    ds = open_dataset("crepe/productivity/swap", str(root), "test", None)
    first = rows[0]
    crop = TF.crop(Image.open(root / "VG_100K_2" / "100.jpg").convert("RGB"), first[2], first[1], first[4], first[3])
    assert np.asarray(ds.load_image(0)).tolist() == np.asarray(crop).tolist()
    assert {len(c) for c in ds.captions} == {4}  # ragged rows padded with their last text


def test_crepe_systematicity_per_compound_split(tmp_path, tiny_model_dir):
    root = tmp_path / "crepe"
    rows = crepe_fixture(root, 8)
    for split, part in (("seen_compounds", rows[:5]), ("unseen_compounds", rows[5:])):
        write_crepe_csv(root / "syst_hard_negatives" / f"syst_vg_hard_negs_{split}_in_laion.csv", part,
                        column="valid_hard_negs_comp")
    ref = Reference(tiny_model_dir)
    scored = run_clipcache(tmp_path, "crepe/systematicity/comp/laion", root)
    assert scored.metrics["text_acc:seen_compounds"] == np.mean(crepe_reference(ref, root, rows[:5]) < 1)
    assert scored.metrics["text_acc:unseen_compounds"] == np.mean(crepe_reference(ref, root, rows[5:]) < 1)
    with pytest.raises(DatasetError, match="no column valid_hard_negs_atom"):
        open_dataset("crepe/systematicity/atom/laion", str(root), "test", None)


def write_vl_checklist(root, kind="relation"):
    """corpus/v1/<path>.yaml naming data/<...>.json and the image folders, for every corpus file of ``kind``."""
    ds = shapes(6)
    for folder in ("vg/VG_100K", "swig", "hake/pic"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            ds.load_image(i).save(root / folder / f"{i}.jpg", quality=95)
    corpus = facts()["vl_checklist_corpus"]
    entries = {}
    for n_file, path in enumerate(p for key in facts()["vl_checklist_types"][kind] for ps in corpus[key].values()
                                  for p in ps):
        source = "hake" if "hake" in path else "swig" if "swig" in path else "vg"
        image_root, sub = {"vg": ("vg", "VG_100K/"), "swig": ("swig/", ""), "hake": ("hake/", "pic/")}[source]
        anno = f"data/{path.replace('/', '_')}.json"
        (root / "corpus" / "v1" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "corpus" / "v1" / f"{path}.yaml").write_text(f'ANNO_PATH: "{anno}"\nIMG_ROOT: "{image_root}"\n'
                                                             f'TYPE: "TUPLE_JSON"\n')
        items = []
        for k in range(3 + n_file % 3):
            i = (n_file + k) % 6
            neg = ds.captions[i][0] if k == 1 else ds.captions[(i + 1 + k) % 6][0]  # k == 1: a tie, a miss
            items.append([f"{sub}{i}.jpg", {"POS": [ds.captions[i][0], "unused"], "NEG": [neg, "unused"]}])
        (root / "data").mkdir(exist_ok=True)
        (root / anno).write_text(json.dumps(items))
        entries[path] = (image_root, items)
    return entries


def test_vl_checklist_equals_its_itc_and_radar_averages(tmp_path, tiny_model_dir):
    root = tmp_path / "vlc"
    entries = write_vl_checklist(root)
    ref = Reference(tiny_model_dir)
    total_acc = {}
    for path, (image_root, items) in entries.items():  # Evaluate.eval, task itc: POS[0] strictly above NEG[0]
        num_t = num_f = 0
        for image, texts in items:
            im = ref.images([Image.open(Path(root, image_root, image)).convert("RGB")])
            pos, neg = (im @ ref.texts([texts["POS"][0], texts["NEG"][0]]).t())[0].tolist()
            num_t, num_f = (num_t + 1, num_f) if pos > neg else (num_t, num_f + 1)
        total_acc[path.replace("/", "_")] = round(float(num_t) / (num_t + num_f), 4)
    radar = {}
    for key in facts()["vl_checklist_types"]["relation"]:  # radar.py generate_chart
        data_score = [sum(total_acc[f.replace("/", "_")] for f in files) / len(files)
                      for files in facts()["vl_checklist_corpus"][key].values()]
        radar[key] = sum(data_score) / len(data_score)

    scored = run_clipcache(tmp_path, "vl_checklist/relation", root)
    for name, acc in total_acc.items():
        assert round(scored.metrics[f"text_acc:{name}"], 4) == acc
    for key, value in radar.items():
        assert scored.metrics[f"text_acc:{key}"] == value
    assert scored.metrics["text_acc:relation"] == pytest.approx(np.mean(list(radar.values())))
    assert "macro_acc" not in scored.metrics  # ARO's metric only
    assert scored.n_samples == sum(len(items) for _, items in entries.values())
    assert min(total_acc.values()) < 1  # the ties (k == 1) are misses


def test_limit_keeps_the_first_items_and_drops_unfinished_averages(tmp_path):
    root = tmp_path / "vlc"
    write_vl_checklist(root)
    ds = open_dataset("vl_checklist/relation", str(root), "test", 4)
    assert ds.n_items == 4 and ds.item_groups == ["Relation_action_vg"] * 3 + ["Relation_action_swig"]
    samples = {"text_right": np.array([1, 1, 0, 1], bool), "sample_index": np.arange(4)}
    metrics = ds.group_metrics(samples)
    assert metrics == {"text_acc:Relation_action_vg": 2 / 3, "text_acc:Relation_action_swig": 1.0}


def test_bad_input_is_named(tmp_path):
    root = tmp_path / "cola"
    (root / "vg_gqa_images").mkdir(parents=True)
    (root / "COLA_multiobjects_matching_benchmark.json").write_text(json.dumps([["a/b/1.jpg", "c", "a/b/2.jpg"]]))
    with pytest.raises(DatasetError, match="entry 0: expected"):
        open_dataset("cola/multi_objects", str(root), "test", None)
    (root / "COLA_multiobjects_matching_benchmark.json").write_text(json.dumps([["a/vg_gqa_images/1.jpg", "c",
                                                                                 "a/vg_gqa_images/2.jpg", "d"]]))
    with pytest.raises(DatasetError, match=r"entry 0: image .*vg_gqa_images/1.jpg not found"):
        open_dataset("cola/multi_objects", str(root), "test", None)

    crepe = tmp_path / "crepe"
    rows = crepe_fixture(crepe, 3)
    rows[2][6] = "not a list"
    write_crepe_csv(crepe / "swap" / "prod_vg_hard_negs_swap_complexity_4.csv", rows)
    with pytest.raises(DatasetError, match=r"complexity_4.csv row 4: expected"):
        open_dataset("crepe/productivity/swap", str(crepe), "test", None)
    rows[2][6], rows[1][0] = "[]", 999
    write_crepe_csv(crepe / "swap" / "prod_vg_hard_negs_swap_complexity_4.csv", rows)
    with pytest.raises(DatasetError, match=r"row 3: image .*999.jpg not found"):
        open_dataset("crepe/productivity/swap", str(crepe), "test", None)
    with pytest.raises(DatasetError, match="complexity_5.csv not found"):
        open_dataset("crepe/productivity/swap", str(crepe), "test", 1)

    vlc = tmp_path / "vlc"
    with pytest.raises(DatasetError, match=r"Relation/action/vg.yaml not found"):
        open_dataset("vl_checklist/relation", str(vlc), "test", None)
    entries = write_vl_checklist(vlc)
    anno = vlc / "data" / "Relation_action_swig.json"
    items = json.loads(anno.read_text())
    items[1][1]["NEG"] = []
    anno.write_text(json.dumps(items))
    with pytest.raises(DatasetError, match="Relation_action_swig.json entry 1: expected"):
        open_dataset("vl_checklist/relation", str(vlc), "test", None)
    with pytest.raises(DatasetError, match="splits"):
        open_dataset("vl_checklist/relation", str(vlc), "train", None)
    assert entries


@pytest.mark.parametrize(("cell", "names"), [
    ("['a dog', \"a man's hat\"]", ["a dog", "a man's hat"]), ("[]", []), ("['it\\'s']", ["it's"]),
    ("__import__('os').system('x')", None), ("['a', b]", None), ("['a'] + ['b']", None), ("['\\n']", None),
    ("[" * 100_000, None)])
def test_list_cells_are_read_as_data_never_evaluated(cell, names):
    """CREPE's hard negatives (and Dollar Street's topics) are Python list literals: read by a pattern that accepts
    quoted names only, the same names ast.literal_eval gives for every cell it accepts; code, or a cell nested deep
    enough to exhaust Python's parser, is refused."""
    from clipcache.tasks.datasets.text_cells import quoted_list

    assert quoted_list(cell) == names
    if names is not None:
        assert ast.literal_eval(cell) == names
