"""multilabel_probe: MIEB's VOC2007 protocol over cached features equals mteb's own multilabel evaluator
(``VOC2007._evaluate_subset``) run on the same embeddings; VOC 2007's original layout is read with the hub copy's
label rule (non-difficult objects) and safely; users' label lists give the same data; sample rows recompute."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from clipcache.storage.embedding_store import EmbeddingStore
from clipcache.storage.errors import DatasetError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.datasets.mieb.multilabel_layouts import VOC_CLASSES, open_label_lists, open_voc2007
from clipcache.tasks.encode.stage import ModelSession
from clipcache.tasks.evaluation import evaluate_one
from clipcache.tasks.evaluation.base import DataSource, EncodeSettings
from clipcache.tasks.models.resolve import resolve_model
from clipcache.tasks.models.spec import ModelSpec
from clipcache.tasks.score.multilabel_probe import SCORES, experiment_picks, experiment_scores, label_sets

USED = ("car", "cat", "dog", "person", "sheep")  # the classes the tiny set draws
COLOURS = {"car": (220, 30, 30), "cat": (30, 200, 30), "dog": (30, 30, 220), "person": (230, 220, 20),
           "sheep": (150, 40, 200)}
SPLITS = {"train": 40, "test": 24}


def _objects(rng: np.random.Generator) -> list[tuple[str, bool]]:
    """One to three objects, some difficult (an image may hold only a difficult one of a class)."""
    names = rng.choice(USED, size=int(rng.integers(1, 4)), replace=False)
    return [(str(n), bool(rng.random() < 0.2)) for n in names]


def _annotation(objects: list[tuple[str, bool]]) -> str:
    parts = "".join(f"<object><name>{n}</name><pose>Unspecified</pose><truncated>0</truncated>"
                    f"<difficult>{int(d)}</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>20</xmax>"
                    f"<ymax>20</ymax></bndbox></object>" for n, d in objects)
    return f"<annotation><folder>VOC2007</folder><size><width>48</width><height>48</height></size>{parts}" \
           f"</annotation>"


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    """VOCdevkit/VOC2007 as distributed: ImageSets/Main/<split>.txt and the per-class <class>_<split>.txt lists
    (1 / -1 / 0 for difficult-only, computed here from the objects), Annotations, JPEGImages (PNG bytes are not VOC's:
    real JPEGs)."""
    root = tmp_path_factory.mktemp("voc")
    base = root / "VOCdevkit" / "VOC2007"
    for sub in ("ImageSets/Main", "Annotations", "JPEGImages"):
        (base / sub).mkdir(parents=True)
    rng = np.random.default_rng(7)
    serial = 0
    for split, n in SPLITS.items():
        ids, per_class = [], {c: [] for c in VOC_CLASSES}
        for _ in range(n):
            serial += 1
            image_id = f"{serial:06d}"
            objects = _objects(rng)
            if split == "test" and serial % 7 == 0:
                objects = [(objects[0][0], True)]  # only a difficult object: no label
            image = Image.new("RGB", (48, 48), (245, 245, 245))
            draw = ImageDraw.Draw(image)
            for k, (name, _) in enumerate(objects):
                x, y = int(rng.integers(0, 28)), int(rng.integers(0, 28))
                draw.rectangle([x, y, x + 12 + 4 * k, y + 12], fill=COLOURS[name])
            image.save(base / "JPEGImages" / f"{image_id}.jpg", quality=95)
            (base / "Annotations" / f"{image_id}.xml").write_text(_annotation(objects))
            ids.append(image_id)
            for c in VOC_CLASSES:
                flags = [d for name, d in objects if name == c]
                per_class[c].append(-1 if not flags else (1 if not all(flags) else 0))
        (base / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")
        for c, values in per_class.items():
            (base / "ImageSets" / "Main" / f"{c}_{split}.txt").write_text(
                "".join(f"{i} {v:2d}\n" for i, v in zip(ids, values, strict=True)))
    return root


@pytest.fixture(scope="module")
def run(voc, tmp_path_factory):
    memo = FileHashMemo(None)
    session = ModelSession(resolve_model(ModelSpec(model_name="tiny-shapes-clip"), memo), torch.device("cpu"), False,
                           "fp32")
    store = EmbeddingStore(tmp_path_factory.mktemp("cache"))

    def evaluate(root=voc, name="voc2007_multilabel", **options):
        return evaluate_one("multilabel_probe", session, DataSource(name, str(root)), store, memo,
                            encode=EncodeSettings(16, 1), options=options)

    return evaluate, store


def test_voc_labels_are_the_devkits_non_difficult_classes(voc):
    """The reader's multi-hot rows equal the devkit's per-class lists (1 = a non-difficult object of the class),
    the rule of mteb's hub copy; a difficult-only image has no label."""
    main = voc / "VOCdevkit" / "VOC2007" / "ImageSets" / "Main"
    for split in SPLITS:
        data = open_voc2007("voc2007_multilabel", voc, split, None)
        for c, name in enumerate(VOC_CLASSES):
            lines = (main / f"{name}_{split}.txt").read_text().split("\n")
            expected = [int(line.split()[1]) == 1 for line in lines if line.strip()]
            assert data.labels[:, c].astype(bool).tolist() == expected, (split, name)
    test = open_voc2007("voc2007_multilabel", voc, "test", None)
    assert (test.labels.sum(axis=1) == 0).any() and test.labels.shape == (24, 20)
    assert open_voc2007("voc2007_multilabel", voc, "test", 5).labels.shape == (5, 20)


def test_an_annotation_with_a_dtd_is_refused_not_expanded(tmp_path):
    base = tmp_path / "VOCdevkit" / "VOC2007"
    (base / "ImageSets" / "Main").mkdir(parents=True)
    (base / "Annotations").mkdir()
    (base / "ImageSets" / "Main" / "test.txt").write_text("000001\n")
    laughs = '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY l "lol"><!ENTITY l2 "&l;&l;&l;&l;">]>' \
             "<annotation><object><name>&l2;</name></object></annotation>"
    (base / "Annotations" / "000001.xml").write_text(laughs)
    with pytest.raises(DatasetError, match=r"000001\.xml: declares a DTD"):
        open_voc2007("voc", tmp_path, "test", None)
    (base / "Annotations" / "000001.xml").write_text("<annotation><object><name>cat</name>")
    with pytest.raises(DatasetError, match="not well-formed"):
        open_voc2007("voc", tmp_path, "test", None)
    (base / "Annotations" / "000001.xml").write_text("<annotation><object><name>kat</name></object></annotation>")
    with pytest.raises(DatasetError, match="'kat' is not a VOC class"):
        open_voc2007("voc", tmp_path, "test", None)
    with pytest.raises(DatasetError, match=r"train\.txt not found \(splits there: test"):
        open_voc2007("voc", tmp_path, "train", None)


def test_the_picks_are_mtebs_undersampling():
    import mteb

    rng = np.random.default_rng(3)
    labels = [sorted(rng.choice(6, size=int(rng.integers(0, 3)), replace=False).tolist()) for _ in range(60)]
    task = mteb.get_task("VOC2007")
    expected = [task._undersample_data_indices(labels, 4, None)[0] for _ in range(5)]
    ours = experiment_picks(labels, 4, 5, 42)
    assert ours == [[int(i) for i in e] for e in expected]
    assert len({tuple(p) for p in ours}) == 5  # one generator: each experiment its own pick


def mteb_voc2007(voc, store, raw: bool):
    """mteb's own VOC2007 `_evaluate_subset` on the same images and label lists, its encoder answering with the
    cached vectors of each image (found by its pixels)."""
    import datasets
    import mteb
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.timing import TimingStack

    by_pixels, splits = {}, {}
    for split in SPLITS:
        data = open_voc2007("voc2007_multilabel", voc, split, None)
        [entry] = [store.open(k) for k in store.keys()
                   if store.open(k).attrs["key_fields"].get("split") == split
                   and store.open(k).attrs["key_fields"]["dataset"].get("format") == "voc2007-mteb"]
        vectors = entry.raw_embeddings("test") if raw else entry.embeddings()
        images = [data.load_image(i) for i in range(len(data))]
        for image, vector in zip(images, vectors, strict=True):
            by_pixels[image.tobytes()] = vector
        splits[split] = datasets.Dataset.from_dict(
            {"image": images, "classes": label_sets(data.labels)},
            features=datasets.Features({"image": datasets.Image(),
                                        "classes": datasets.Sequence(datasets.Value("int64"))}))

    class CachedEncoder(AbsEncoder):
        def __init__(self):
            pass

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            return np.stack([by_pixels[image.convert("RGB").tobytes()] for batch in inputs for image in batch["image"]])

    task = mteb.get_task("VOC2007")
    assert (task.samples_per_label, task.n_experiments, task.seed, task.max_eval_samples) == (8, 5, 42, None)
    return task._evaluate_subset(CachedEncoder(), datasets.DatasetDict(splits), encode_kwargs={"batch_size": 16},
                                 hf_split="test", hf_subset="default", timer=TimingStack())


@pytest.mark.parametrize("features", ["raw", "normalized"])
def test_equal_to_mtebs_voc2007_evaluation_on_the_same_embeddings(run, voc, features):
    evaluate, store = run
    scored = evaluate(probe_features=features)
    theirs = mteb_voc2007(voc, store, raw=features == "raw")
    for name in SCORES:
        assert scored.metrics[f"multilabel_{name}"] == theirs[name], name  # bit for bit
        spread = np.std([s[name] for s in theirs["scores_per_experiment"]])
        assert scored.metrics[f"multilabel_{name}_std"] == spread, name
    assert scored.n_samples == 24 and 0 < scored.metrics["multilabel_lrap"] <= 1


def test_raw_and_normalised_features_and_options_give_other_probes(run):
    evaluate, _ = run
    base = evaluate().metrics
    assert evaluate(multilabel_knn_k=1).metrics != base
    assert evaluate(multilabel_samples_per_label=2, probe_seed=1).metrics != base
    with pytest.raises(DatasetError, match="fewer than the 30 neighbours"):
        evaluate(multilabel_knn_k=30)


def test_sample_rows_recompute_accuracy_and_hamming(run, voc):
    evaluate, _ = run
    scored = evaluate(n_experiments=3)
    parts = scored.evidence.parts()
    assert [p.unit for p in parts] == ["image_experiment_0", "image_experiment_1", "image_experiment_2"]
    truth = open_voc2007("voc2007_multilabel", voc, "test", None).labels
    present = np.flatnonzero(truth.any(axis=0))
    accuracy, hamming = [], []
    for part in parts:
        top = part.columns["top"]
        predicted = np.zeros((len(truth), len(VOC_CLASSES)), dtype=np.int64)
        for row in range(len(truth)):
            predicted[row, top.values[top.offsets[row]:top.offsets[row + 1]]] = 1
        scores = experiment_scores(truth[:, present], predicted[:, present])
        assert part.columns["correct1"].mean() == pytest.approx(scores["accuracy"])
        assert part.columns["value"].mean() == pytest.approx(scores["hamming"])
        assert part.keys[0] == "000041.jpg"
        accuracy.append(scores["accuracy"])
        hamming.append(scores["hamming"])
    assert scored.metrics["multilabel_accuracy"] == pytest.approx(np.mean(accuracy))
    assert scored.metrics["multilabel_hamming"] == pytest.approx(np.mean(hamming))


def _label_lists(voc, root, fmt: str) -> None:
    root.mkdir()
    for split in SPLITS:
        data = open_voc2007("voc2007_multilabel", voc, split, None)
        rows = [(str(p), [VOC_CLASSES[c] for c in np.flatnonzero(r)]) for p, r in zip(data.image_paths, data.labels,
                                                                                      strict=True)]
        if fmt == "jsonl":
            (root / f"multilabel_{split}.jsonl").write_text(
                "".join(json.dumps({"image_path": p, "labels": ls}) + "\n" for p, ls in rows))
        else:
            (root / f"multilabel_{split}.csv").write_text(
                "image_path,labels\n" + "".join(f"{p},{'|'.join(ls)}\n" for p, ls in rows))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_label_lists_give_the_voc_numbers(run, voc, tmp_path, fmt):
    """The same images and label sets as users' label lists: the classes are only those used (another order and
    count of columns), the numbers the same."""
    evaluate, _ = run
    _label_lists(voc, tmp_path / "mine", fmt)
    data = open_label_lists("mine", tmp_path / "mine", "test", None)
    assert data.prompts.classnames == sorted(USED) and data.labels.shape == (24, 5)
    ours = evaluate(tmp_path / "mine", "mine").metrics
    assert ours == pytest.approx(evaluate().metrics, abs=1e-12)


def test_label_list_errors_name_the_file_and_line(tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "classnames.txt").write_text("cat\ndog\n")
    (tmp_path / "multilabel_test.jsonl").write_text('{"image_path": "a.png", "labels": ["cat"]}\n'
                                                     '{"image_path": "a.png", "labels": ["cow"]}\n')
    with pytest.raises(DatasetError, match=r"multilabel_test\.jsonl line 2: label 'cow' is not in classnames\.txt"):
        open_label_lists("mine", tmp_path, "test", None)
    assert open_label_lists("mine", tmp_path, "test", 1).labels.tolist() == [[1, 0]]
    (tmp_path / "multilabel_test.jsonl").write_text('{"image_path": "b.png", "labels": ["cat"]}\n')
    with pytest.raises(DatasetError, match=r"line 1: image_path 'b.png' not found"):
        open_label_lists("mine", tmp_path, "test", None)
    with pytest.raises(DatasetError, match=r"no multilabel_train\.jsonl or \.csv .* \(splits there: test\)"):
        open_label_lists("mine", tmp_path, "train", None)


def test_any_name_with_such_a_folder_is_the_multilabel_task(voc, tmp_path):
    from clipcache.tasks.datasets import check_name, default_task

    check_name("my_voc", str(voc))
    assert default_task("my_voc", str(voc)) == "multilabel_probe"
    assert default_task("voc2007_multilabel", str(voc)) == "zeroshot_classification"  # clip_benchmark's set
