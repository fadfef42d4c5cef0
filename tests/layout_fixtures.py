"""Tiny datasets on disk in the exact layouts that LAION clip_benchmark 1.6.2 reads (through torchvision 0.29.1 or its
own dataset classes), for reading each one with ``build_dataset(dataset_name=name, root=str(write_layout(name, root,
split, language)), split=split, download=False, language=language, task=...)`` after ``no_integrity_checks``.

Every writer writes all the splits its dataset has (different images per split), deterministically (pixels from a
RandomState seeded by dataset, split and index), into ``root`` itself, and returns ``root``; writing twice is harmless.
Datasets read as a bare ImageFolder (imagenet_sketch, imagenet-a/-r/-o, imagenet1k-unverified, fer2013) take ``root``
as their image folder: give each of those a folder of its own.

Layouts written (paths under root):
  mnist:            MNIST/raw/{train,t10k}-images-idx3-ubyte + {train,t10k}-labels-idx1-ubyte (uncompressed IDX, 28x28)
  stl10:            stl10_binary/{train,test}_{X,y}.bin, unlabeled_X.bin (96x96, column-major), class_names.txt,
                    fold_indices.txt; y bytes are 1-based
  food101:          food-101/images/<class>/<id>.jpg, food-101/meta/{train,test}.json ({class: ["class/id"]}),
                    meta/{classes,labels,train,test}.txt
  sun397:           SUN397/ClassName.txt ("/a/abbey"), SUN397/<letter>/<class>[/<sub>]/sun_<id>.jpg (no splits)
  cars:             stanford_cars/devkit/{cars_meta.mat,cars_train_annos.mat}, stanford_cars/cars_train/<nnnnn>.jpg,
                    stanford_cars/cars_test_annos_withlabels.mat, stanford_cars/cars_test/<nnnnn>.jpg (class 1-based)
  fgvc_aircraft:    fgvc-aircraft-2013b/data/{variants,families,manufacturers}.txt,
                    data/images_{variant,family,manufacturer}_{train,val,trainval,test}.txt, data/images/<id>.jpg
  dtd:              dtd/dtd/images/<class>/<class>_<nnnn>.jpg, dtd/dtd/labels/{train,val,test}{1..10}.txt
  pets:             oxford-iiit-pet/images/<Breed>_<n>.jpg, oxford-iiit-pet/annotations/{trainval,test,list}.txt
                    ("<image id> <class 1-based> <species 1|2> <breed id>")
  flowers:          flowers-102/jpg/image_<nnnnn>.jpg, flowers-102/imagelabels.mat (labels 1..102 by image id),
                    flowers-102/setid.mat (trnid, valid, tstid)
  eurosat:          eurosat/2750/<Class>/<Class>_<n>.jpg, all 10 class folders (no splits)
  gtsrb:            gtsrb/GTSRB/Training/<000NN>/{GT-000NN.csv,<track>_<image>.ppm} for all 43 classes;
                    gtsrb/GTSRB/Final_Test/Images/{<nnnnn>.ppm,GT-final_test.test.csv}, gtsrb/GT-final_test.csv
  country211:       country211/{train,valid,test}/<ISO code>/<id>.jpg; the first classes in sorted order (indices
                    equal the real ones), or all 211 with all_classes=True
  pcam:             pcam/camelyonpatch_level_2_split_{train,valid,test}_{x,y}.h5 (x: N,96,96,3 uint8; y: N,1,1,1)
  renderedsst2:     rendered-sst2/{train,valid,test}/{negative,positive}/<nnnnn>.png
  fer2013:          {train,test}/{angry,disgust,fear,happy,neutral,sad,surprise}/<Training|PrivateTest>_<id>.jpg,
                    48x48 grayscale
  caltech101:       caltech101/101_ObjectCategories/<102 folders incl. BACKGROUND_Google>/image_<nnnn>.jpg, images in
                    a few (no splits)
  imagenet_sketch:  <wnid>/sketch_<n>.JPEG; the first ImageNet wnids in sorted order, or all 1000 (all_classes=True)
  imagenet-a:       <wnid>/<n>_<name>.jpg for all 200 ImageNet-A wnids (or the first few: all_classes=False)
  imagenet-r:       <wnid>/<style>_<n>.jpg for all 200 ImageNet-R wnids (or the first few: all_classes=False)
  imagenet-o:       <wnid>/<n>_<name>.jpg for all 200 ImageNet-O wnids (or the first few: all_classes=False)
  imagenetv2:       ImageNetV2-matched-frequency/<class index>/<hash>.jpeg (IMAGENETV2_COUNT files, not 10,000)
  imagenet1k-unverified: {train,val}/<wnid>/*.JPEG; the first wnids in sorted order, or all 1000 (all_classes=True)
  objectnet:        objectnet-1.0/images/<folder>/<n>.png (some folders unmapped), folder_to_objectnet_label.json,
                    objectnet_to_imagenet_1k.json, pytorch_to_imagenet_2012_id.json, imagenet_to_label_2012_v2
  voc2007(_multilabel): VOCdevkit/VOC2007/{JPEGImages/<id>.jpg, Annotations/<id>.xml (objects with boxes),
                    ImageSets/Main/aeroplane_{train,test}.txt}
  mscoco_captions:  {train2014,val2014}/COCO_<folder>_<id:012>.jpg, coco_{train,val,test}_karpathy.json (COCO format,
                    5 to 7 captions per image; val and test both read val2014/)
  multilingual_mscoco_captions: multilingual_mscoco/images/<name>.jpg, multilingual_mscoco_captions-<lang>.json
  crossmodal3600:   xm3600/images/<key>.jpg, xm3600/captions.jsonl (every language), crossmodal3600_captions-<lang>.json
  xtd10:            xtd10/images/<name>.jpg, xtd10-<lang>.json
  xtd200:           xtd200/images/<name>.jpg, xtd200-<lang>.json (<lang> a FLORES code such as eng_Latn)
  flickr30k-200:    flickr30k-200/images/<id>.jpg, flickr30k_200-<lang>.json (<lang> a FLORES code)
The multilingual annotation files are ``{"image_paths": [absolute paths], "annotations": [one caption each],
"indices"|"indicies": [...]}`` as each module's create_annotation_file writes them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# The splits each fixture writes (and clip_benchmark accepts). sun397, eurosat and caltech101 have none: clip_benchmark
# ignores split there, so "train" reads the same images as "test". The multilingual sets ignore split too.
SPLITS: dict[str, tuple[str, ...]] = {
    "mnist": ("train", "test"),
    "stl10": ("train", "test"),
    "food101": ("train", "test"),
    "sun397": ("test", "train"),
    "cars": ("train", "test"),
    "fgvc_aircraft": ("train", "val", "trainval", "test"),
    "dtd": ("train", "val", "test"),
    "pets": ("trainval", "test"),
    "flowers": ("train", "val", "test"),
    "eurosat": ("test", "train"),
    "gtsrb": ("train", "test"),
    "country211": ("train", "valid", "test"),
    "pcam": ("train", "val", "test"),
    "renderedsst2": ("train", "val", "test"),
    "fer2013": ("train", "test"),
    "caltech101": ("test", "train"),
    "imagenet_sketch": ("test",),
    "imagenet-a": ("test",),
    "imagenet-r": ("test",),
    "imagenet-o": ("test",),
    "imagenetv2": ("test",),
    "imagenet1k-unverified": ("train", "test"),
    "mscoco_captions": ("train", "val", "test"),
    "objectnet": ("test",),
    "voc2007": ("train", "test"),
    "voc2007_multilabel": ("train", "test"),
    "multilingual_mscoco_captions": ("test",),
    "crossmodal3600": ("test",),
    "xtd10": ("test",),
    "xtd200": ("test",),
    "flickr30k-200": ("test",),
}

RETRIEVAL = ("mscoco_captions", "multilingual_mscoco_captions", "crossmodal3600", "xtd10", "xtd200", "flickr30k-200")

# clip_benchmark module of each multilingual set (SUPPORTED_LANGUAGES, OUTPUT_FILENAME_TEMPLATE), its image folder
# under root, and the key create_annotation_file writes its indices under.
MULTILINGUAL = {
    "multilingual_mscoco_captions": ("multilingual_mscoco", "multilingual_mscoco", "indicies"),
    "crossmodal3600": ("crossmodal3600", "xm3600", "indicies"),
    "xtd10": ("xtd10", "xtd10", "indices"),
    "xtd200": ("xtd200", "xtd200", "indicies"),
    "flickr30k-200": ("flickr30k_200", "flickr30k-200", "indicies"),
}

IMAGENETV2_COUNT = 9  # files written for imagenetv2; no_integrity_checks sets clip_benchmark's expected count to it
FEW = 4  # classes written for the 1000 / 211-class ImageFolder sets unless all_classes=True (the first, sorted)


# -- integrity checks --------------------------------------------------------------------------------------------------


def _exists_only(fpath, md5=None) -> bool:
    return Path(fpath).is_file()


def no_integrity_checks(monkeypatch) -> None:
    """Let clip_benchmark read generated files; ``monkeypatch`` is pytest's MonkeyPatch (or anything with setattr).

    Patched (the narrowest names; missing files still fail):
      torchvision.datasets.stl10.check_integrity       STL10._check_integrity MD5-checks train_X/train_y/unlabeled_X/
                                                       test_X/test_y.bin -> existence only
      torchvision.datasets.flowers102.check_integrity  Flowers102._check_integrity MD5-checks imagelabels.mat and
                                                       setid.mat -> existence only
      clip_benchmark.datasets.imagenetv2.V2_DATASET_SIZE  ImageNetV2Dataset downloads (requests.get) the archive unless
                                                       it finds exactly 10,000 *.jpeg files -> IMAGENETV2_COUNT
    Not needed: MNIST (check_integrity without an MD5 = exists), PCAM (exists), all others (folder exists).
    """
    import torchvision.datasets.flowers102
    import torchvision.datasets.stl10
    from clip_benchmark.datasets import imagenetv2

    monkeypatch.setattr(torchvision.datasets.stl10, "check_integrity", _exists_only)
    monkeypatch.setattr(torchvision.datasets.flowers102, "check_integrity", _exists_only)
    monkeypatch.setattr(imagenetv2, "V2_DATASET_SIZE", IMAGENETV2_COUNT)


# -- pixels ------------------------------------------------------------------------------------------------------------


def _rng(*key) -> np.random.RandomState:
    return np.random.RandomState(zlib.crc32("/".join(map(str, key)).encode()))


def _pixels(rng: np.random.RandomState, height: int, width: int, channels: int = 3) -> np.ndarray:
    """4 x 4 colour blocks plus noise: different for every seed, small as JPEG. (h, w, c) uint8, or (h, w) if c == 1."""
    grid = rng.randint(0, 256, size=(4, 4, channels)).astype(np.int16)
    blocks = grid[np.arange(height) * 4 // height][:, np.arange(width) * 4 // width]
    out = np.clip(blocks + rng.randint(-24, 25, size=blocks.shape), 0, 255).astype(np.uint8)
    return out[..., 0] if channels == 1 else out


def _image(rng: np.random.RandomState, size: tuple[int, int] | None = None, gray: bool = False) -> Image.Image:
    w, h = size if size is not None else (int(rng.randint(24, 49)), int(rng.randint(24, 49)))
    return Image.fromarray(_pixels(rng, h, w, 1 if gray else 3))


_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".ppm": "PPM"}


def _save(path: Path, rng: np.random.RandomState, size: tuple[int, int] | None = None, gray: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = _image(rng, size, gray)
    fmt = _FORMATS[path.suffix.lower()]
    image.save(path, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return path


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _lines(path: Path, lines) -> None:
    _write_text(path, "".join(f"{line}\n" for line in lines))


# -- torchvision binary / array formats --------------------------------------------------------------------------------


def write_mnist(root: Path) -> Path:
    """MNIST/raw/: the four uncompressed IDX files torchvision's MNIST needs (it checks all four exist)."""
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, labels in (("train", [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]), ("t10k", [7, 2, 1, 0, 4, 1, 4, 9, 5, 9, 0, 6])):
        rng = _rng("mnist", prefix)
        images = np.stack([_pixels(rng, 28, 28, 1) for _ in labels])
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, *images.shape) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 0x801, len(labels)) + bytes(labels))
    return Path(root)


STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def write_stl10(root: Path) -> Path:
    """stl10_binary/: 96x96 images stored channel, column, row (torchvision transposes); labels 1-based bytes."""
    folder = Path(root) / "stl10_binary"
    folder.mkdir(parents=True, exist_ok=True)

    def images(key, n):
        rng = _rng("stl10", key)
        return np.stack([_pixels(rng, 96, 96).transpose(2, 1, 0) for _ in range(n)])

    train_y, test_y = [2, 7, 1, 10, 3, 3, 9, 6], [7, 1, 10, 4, 2, 5, 8, 6, 9, 3]  # 1-based, as in the real files
    (folder / "train_X.bin").write_bytes(images("train", len(train_y)).tobytes())
    (folder / "train_y.bin").write_bytes(bytes(train_y))
    (folder / "test_X.bin").write_bytes(images("test", len(test_y)).tobytes())
    (folder / "test_y.bin").write_bytes(bytes(test_y))
    (folder / "unlabeled_X.bin").write_bytes(images("unlabeled", 2).tobytes())
    _lines(folder / "class_names.txt", STL10_CLASSES)
    _lines(folder / "fold_indices.txt", [" ".join(str((f + i) % len(train_y)) for i in range(4)) for f in range(10)])
    return Path(root)


def write_pcam(root: Path) -> Path:
    """pcam/camelyonpatch_level_2_split_{train,valid,test}_{x,y}.h5 (h5py): x (N, 96, 96, 3) uint8, y (N, 1, 1, 1)."""
    import h5py

    folder = Path(root) / "pcam"
    folder.mkdir(parents=True, exist_ok=True)
    for split, labels in (("train", [0, 1, 1, 0, 1, 0]), ("valid", [1, 0, 0, 1]), ("test", [1, 0, 1, 1, 0, 0])):
        rng = _rng("pcam", split)
        x = np.stack([_pixels(rng, 96, 96) for _ in labels])
        with h5py.File(folder / f"camelyonpatch_level_2_split_{split}_x.h5", "w") as f:
            f.create_dataset("x", data=x)
        with h5py.File(folder / f"camelyonpatch_level_2_split_{split}_y.h5", "w") as f:
            f.create_dataset("y", data=np.asarray(labels, dtype=np.uint8).reshape(-1, 1, 1, 1))
    return Path(root)


# -- torchvision list / metadata layouts -------------------------------------------------------------------------------


def write_food101(root: Path) -> Path:
    """food-101/: meta/{train,test}.json list "class/id" per class (torchvision's classes: the split file's keys)."""
    base = Path(root) / "food-101"
    classes = ["apple_pie", "baby_back_ribs", "baklava"]
    ids = {"train": [[1005649, 101251], [1007102, 1000447], [1006121, 1034361]],  # not ascending within a class
           "test": [[1011328, 101252], [1042299, 1029003], [1014880, 1006898]]}
    for split, per_class in ids.items():
        meta = {}
        for c, (cls, numbers) in enumerate(zip(classes, per_class, strict=True)):
            meta[cls] = [f"{cls}/{n}" for n in numbers]
            for n in numbers:
                _save(base / "images" / cls / f"{n}.jpg", _rng("food101", split, c, n))
        _write_text(base / "meta" / f"{split}.json", json.dumps(meta))
        _lines(base / "meta" / f"{split}.txt", [p for paths in meta.values() for p in paths])
    _lines(base / "meta" / "classes.txt", classes)
    _lines(base / "meta" / "labels.txt", [c.replace("_", " ").capitalize() for c in classes])
    return Path(root)


SUN397_CLASSES = ["/a/abbey", "/a/airplane_cabin", "/b/bakery/shop", "/c/church/outdoor"]


def write_sun397(root: Path) -> Path:
    """SUN397/ClassName.txt and SUN397/<letter>/<class>/sun_<id>.jpg (one class two levels deep, as the real ones)."""
    base = Path(root) / "SUN397"
    _lines(base / "ClassName.txt", SUN397_CLASSES)
    rng = _rng("sun397")
    for c, cls in enumerate(SUN397_CLASSES):
        for j in range(2 if c != 1 else 3):
            key = "".join(chr(ord("a") + int(k)) for k in rng.randint(0, 26, size=16))
            _save(base / cls.lstrip("/") / f"sun_{key}.jpg", _rng("sun397", c, j))
    return Path(root)


CARS_CLASSES = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012", "Acura TL Type-S 2008"]


def _savemat(path: Path, data: dict) -> None:
    from scipy.io import savemat

    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(str(path), data)


def _annotation_structs(rows: list[dict]) -> np.ndarray:
    """A 1 x N MATLAB struct array (what loadmat(squeeze_me=True)["annotations"] iterates over)."""
    structs = np.zeros((1, len(rows)), dtype=[(key, object) for key in rows[0]])
    for i, row in enumerate(rows):
        for key, value in row.items():
            structs[0, i][key] = value
    return structs


def write_cars(root: Path) -> Path:
    """stanford_cars/: devkit/cars_meta.mat (class_names), devkit/cars_train_annos.mat, cars_test_annos_withlabels.mat
    (annotations: bbox_x1, bbox_y1, bbox_x2, bbox_y2, class 1-based, fname), cars_train/ and cars_test/ images."""
    base = Path(root) / "stanford_cars"
    _savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.array([CARS_CLASSES], dtype=object)})
    for split, classes, mat in (("train", [3, 1, 4, 2, 1, 4], base / "devkit" / "cars_train_annos.mat"),
                                ("test", [2, 4, 1, 3, 3, 1], base / "cars_test_annos_withlabels.mat")):
        rows = []
        for i, cls in enumerate(classes):
            fname = f"{i + 1:05d}.jpg"
            image = _save(base / f"cars_{split}" / fname, _rng("cars", split, i))
            w, h = Image.open(image).size
            rows.append({"bbox_x1": np.uint16(1), "bbox_y1": np.uint16(2), "bbox_x2": np.uint16(w - 1),
                         "bbox_y2": np.uint16(h - 2), "class": np.uint8(cls), "fname": fname})
        _savemat(mat, {"annotations": _annotation_structs(rows)})
    return Path(root)


FGVC_VARIANTS = [("707-320", "Boeing 707", "Boeing"), ("A300B4", "A300", "Airbus"),
                 ("Cessna 172", "Cessna 172", "Cessna"), ("F-16A/B", "F-16A/B", "Lockheed Martin")]


def write_fgvc_aircraft(root: Path) -> Path:
    """fgvc-aircraft-2013b/data/: variants.txt (the class list, file order), images_variant_<split>.txt
    ("<image id> <variant name with spaces>"), the family / manufacturer files alike, images/<id>.jpg."""
    data = Path(root) / "fgvc-aircraft-2013b" / "data"
    for level, column in (("variant", 0), ("family", 1), ("manufacturer", 2)):
        names = list(dict.fromkeys(v[column] for v in FGVC_VARIANTS))
        _lines(data / {"variant": "variants.txt", "family": "families.txt", "manufacturer": "manufacturers.txt"}[level],
               names)
    splits = {"train": [(1025794, 2), (1340192, 0), (2231449, 3), (1107562, 1)],
              "val": [(1514522, 1), (601130, 3), (1129497, 0), (2033151, 2)],
              "test": [(1514529, 3), (1848201, 0), (56978, 2), (1194363, 1)]}
    splits["trainval"] = splits["train"] + splits["val"]
    for split, rows in splits.items():
        for level, column in (("variant", 0), ("family", 1), ("manufacturer", 2)):
            _lines(data / f"images_{level}_{split}.txt", [f"{i:07d} {FGVC_VARIANTS[c][column]}" for i, c in rows])
        for i, _ in rows:
            _save(data / "images" / f"{i:07d}.jpg", _rng("fgvc", i))
    return Path(root)


DTD_CLASSES = ["banded", "blotchy", "braided"]


def write_dtd(root: Path) -> Path:
    """dtd/dtd/images/<class>/<class>_<nnnn>.jpg and labels/{train,val,test}<1..10>.txt ("class/file"); torchvision
    reads partition 1, its classes are the sorted classes named in that split file."""
    data = Path(root) / "dtd" / "dtd"
    files = {cls: [f"{cls}_{n:04d}.jpg" for n in (2, 8, 14, 51)] for cls in DTD_CLASSES}
    for c, (cls, names) in enumerate(files.items()):
        for j, name in enumerate(names):
            _save(data / "images" / cls / name, _rng("dtd", c, j))
    for partition in range(1, 11):
        assignment = {"train": [], "val": [], "test": []}
        for cls, names in files.items():
            for j, name in enumerate(names):
                assignment[("train", "val", "test", "test")[(j + partition - 1) % 4]].append(f"{cls}/{name}")
        for split, lines in assignment.items():
            _lines(data / "labels" / f"{split}{partition}.txt", lines)
    return Path(root)


PETS_BREEDS = [("Abyssinian", 1, 1), ("american_bulldog", 2, 1), ("american_pit_bull_terrier", 2, 2),
               ("basset_hound", 2, 3)]  # (name, species 1 cat / 2 dog, breed id within species); class id = index + 1


def write_pets(root: Path) -> Path:
    """oxford-iiit-pet/images/<Breed>_<n>.jpg, annotations/{trainval,test}.txt and list.txt; every breed in both
    splits (torchvision derives the class list from the (breed, label) pairs present). One image is grayscale."""
    base = Path(root) / "oxford-iiit-pet"
    splits = {"trainval": [(0, 100), (0, 101), (1, 10), (2, 1), (3, 15), (3, 16)],
              "test": [(0, 201), (1, 105), (1, 107), (2, 190), (3, 200)]}
    listing = []
    for split, rows in splits.items():
        lines = []
        for breed, n in rows:
            name, species, breed_id = PETS_BREEDS[breed]
            image_id = f"{name}_{n}"
            _save(base / "images" / f"{image_id}.jpg", _rng("pets", image_id), gray=(split, n) == ("test", 105))
            lines.append(f"{image_id} {breed + 1} {species} {breed_id}")
        _lines(base / "annotations" / f"{split}.txt", lines)
        listing += lines
    header = ["#Image CLASS-ID SPECIES BREED ID", "#ID: 1:37 Class ids", "#SPECIES: 1:Cat 2:Dog",
              "#BREED ID: 1-25:Cat 1:12:Dog", "#All images with 1st letter as captial are cat images",
              "#images with small first letter are dog images"]
    _lines(base / "annotations" / "list.txt", header + sorted(listing, key=str.lower))
    return Path(root)


def write_flowers(root: Path) -> Path:
    """flowers-102/jpg/image_<nnnnn>.jpg, imagelabels.mat (labels 1..102 indexed by image id) and setid.mat; the first
    test image is not of (0-based) class 1, so clip_benchmark keeps the labels as they are."""
    base = Path(root) / "flowers-102"
    labels = [77, 1, 102, 51, 12, 3, 77, 46, 1, 89, 102, 20]  # 1-based, image ids 1..12
    for image_id in range(1, len(labels) + 1):
        _save(base / "jpg" / f"image_{image_id:05d}.jpg", _rng("flowers", image_id))
    _savemat(base / "imagelabels.mat", {"labels": np.array([labels], dtype=np.uint8)})
    _savemat(base / "setid.mat", {"trnid": np.array([[5, 2, 9, 12]], dtype=np.uint16),
                                  "valid": np.array([[4, 11, 6]], dtype=np.uint16),
                                  "tstid": np.array([[1, 3, 8, 10, 7]], dtype=np.uint16)})
    return Path(root)


GTSRB_CSV_HEADER = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"


def write_gtsrb(root: Path) -> Path:
    """gtsrb/GTSRB/Training/<000NN>/ for all 43 classes (torchvision's make_dataset needs every class folder non-empty;
    one .ppm each, two in a few, plus the GT-000NN.csv it skips), and gtsrb/GTSRB/Final_Test/Images/*.ppm read through
    gtsrb/GT-final_test.csv (";"-separated, ClassId column)."""
    base = Path(root) / "gtsrb"
    training = base / "GTSRB" / "Training"
    for c in range(43):
        rows = [GTSRB_CSV_HEADER]
        for track in range(2 if c in (0, 14, 42) else 1):
            name = f"{track:05d}_{(7 * c) % 30:05d}.ppm"
            w, h = Image.open(_save(training / f"{c:05d}" / name, _rng("gtsrb", "train", c, track))).size
            rows.append(f"{name};{w};{h};1;1;{w - 2};{h - 2};{c}")
        _lines(training / f"{c:05d}" / f"GT-{c:05d}.csv", rows)
    images = base / "GTSRB" / "Final_Test" / "Images"
    rows, test_rows = [GTSRB_CSV_HEADER], [GTSRB_CSV_HEADER.rsplit(";", 1)[0]]
    for i, c in enumerate([16, 1, 38, 33, 11, 38, 0]):
        name = f"{i:05d}.ppm"
        w, h = Image.open(_save(images / name, _rng("gtsrb", "test", i))).size
        rows.append(f"{name};{w};{h};1;1;{w - 2};{h - 2};{c}")
        test_rows.append(f"{name};{w};{h};1;1;{w - 2};{h - 2}")
    _lines(base / "GT-final_test.csv", rows)
    _lines(images / "GT-final_test.test.csv", test_rows)
    return Path(root)


def write_renderedsst2(root: Path) -> Path:
    """rendered-sst2/{train,valid,test}/{negative,positive}/<nnnnn>.png: rendered sentences, black on white."""
    sentences = {"negative": ["a dull , lifeless film", "it never finds its rhythm", "flat and forgettable"],
                 "positive": ["a warm , funny delight", "smart and moving", "one of the year 's best"]}
    for s, split in enumerate(("train", "valid", "test")):
        for label, texts in sentences.items():
            for j in range(2):
                text = texts[(s + j) % len(texts)]
                image = Image.new("RGB", (96 + 8 * j, 40), "white")
                ImageDraw.Draw(image).text((2, 12), text, fill="black")
                path = Path(root) / "rendered-sst2" / split / label / f"{s * 100 + j * 7 + len(label):05d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                image.save(path, format="PNG")
    return Path(root)


# -- image folders -----------------------------------------------------------------------------------------------------


def write_eurosat(root: Path) -> Path:
    """eurosat/2750/<Class>/<Class>_<n>.jpg: all 10 class folders (ImageFolder needs each non-empty)."""
    classes = ["AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture", "PermanentCrop",
               "Residential", "River", "SeaLake"]
    for c, cls in enumerate(classes):
        for n in ([1, 10, 2] if c in (3, 9) else [1]):  # "_10" sorts before "_2", as in the real folders
            _save(Path(root) / "eurosat" / "2750" / cls / f"{cls}_{n}.jpg", _rng("eurosat", cls, n), size=(32, 32))
    return Path(root)


COUNTRY211_CODES = (
    "AD AE AF AG AI AL AM AO AQ AR AT AU AW AX AZ BA BB BD BE BF BG BH BJ BM BN BO BQ BR BS BT BW BY BZ CA CD CF CH CI CK "
    "CL CM CN CO CR CU CV CW CY CZ DE DK DM DO DZ EC EE EG ES ET FI FJ FK FO FR GA GB GD GE GF GG GH GI GL GM GP GR GS GT "
    "GU GY HK HN HR HT HU ID IE IL IM IN IQ IR IS IT JE JM JO JP KE KG KH KN KP KR KW KY KZ LA LB LC LI LK LR LT LU LV LY "
    "MA MC MD ME MF MG MK ML MM MN MO MQ MR MT MU MV MW MX MY MZ NA NC NG NI NL NO NP NZ OM PA PE PF PG PH PK PL PR PS PT "
    "PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SS SV SX SY SZ TG TH TJ TL TM TN TO TR TT TW TZ UA "
    "UG US UY UZ VA VE VG VI VN VU WS XK YE ZA ZM ZW").split()  # the 211 folder names, sorted = clip_benchmark's order


def write_country211(root: Path, all_classes: bool = False) -> Path:
    """country211/{train,valid,test}/<ISO>/<id>.jpg: the first FEW codes (so ImageFolder's indices are the real
    ones), or all 211 with one image each."""
    codes = COUNTRY211_CODES if all_classes else COUNTRY211_CODES[:FEW]
    for split in ("train", "valid", "test"):
        for c, code in enumerate(codes):
            for j in range(2 if (c + len(split)) % 3 == 0 else 1):
                n = 1000 * (c + 1) + 17 * j + len(split)
                _save(Path(root) / "country211" / split / code / f"{n}.jpg", _rng("country211", split, code, j))
    return Path(root)


FER2013_FOLDERS = ["angry", "disgust", "fear", "happy", "neutral", "sad", "surprise"]


def write_fer2013(root: Path) -> Path:
    """{train,test}/<emotion>/ (the unzipped Kaggle msambare/fer2013 archive): 48x48 grayscale JPEGs, all 7 folders."""
    for split, prefix in (("train", "Training"), ("test", "PrivateTest")):
        for c, emotion in enumerate(FER2013_FOLDERS):
            for j in range(2 if c in (0, 3, 6) else 1):
                n = 10000000 + 7919 * (c * 3 + j) + len(split)
                _save(Path(root) / split / emotion / f"{prefix}_{n}.jpg", _rng("fer2013", split, c, j), size=(48, 48),
                      gray=True)
    return Path(root)


CALTECH101_FOLDERS = (
    "BACKGROUND_Google Faces Faces_easy Leopards Motorbikes accordion airplanes anchor ant barrel bass beaver binocular "
    "bonsai brain brontosaurus buddha butterfly camera cannon car_side ceiling_fan cellphone chair chandelier cougar_body "
    "cougar_face crab crayfish crocodile crocodile_head cup dalmatian dollar_bill dolphin dragonfly electric_guitar "
    "elephant emu euphonium ewer ferry flamingo flamingo_head garfield gerenuk gramophone grand_piano hawksbill headphone "
    "hedgehog helicopter ibis inline_skate joshua_tree kangaroo ketch lamp laptop llama lobster lotus mandolin mayfly "
    "menorah metronome minaret nautilus octopus okapi pagoda panda pigeon pizza platypus pyramid revolver rhino rooster "
    "saxophone schooner scissors scorpion sea_horse snoopy soccer_ball stapler starfish stegosaurus stop_sign strawberry "
    "sunflower tick trilobite umbrella watch water_lilly wheelchair wild_cat windsor_chair wrench yin_yang").split()


def write_caltech101(root: Path) -> Path:
    """caltech101/101_ObjectCategories/: all 102 folders (BACKGROUND_Google kept), images in a few; clip_benchmark's
    own Caltech101 counts *.jpg per folder and opens image_0001.jpg .. image_<count>.jpg. One image is grayscale."""
    base = Path(root) / "caltech101" / "101_ObjectCategories"
    counts = {"BACKGROUND_Google": 1, "Faces": 2, "Leopards": 1, "accordion": 2, "car_side": 1, "yin_yang": 2}
    for folder in CALTECH101_FOLDERS:
        (base / folder).mkdir(parents=True, exist_ok=True)
        for n in range(1, counts.get(folder, 0) + 1):
            _save(base / folder / f"image_{n:04d}.jpg", _rng("caltech101", folder, n), gray=folder == "car_side")
    return Path(root)


def _all_wnids() -> list[str]:
    from clip_benchmark.datasets.builder import all_imagenet_wordnet_ids

    return list(all_imagenet_wordnet_ids)


def builder_wnids(name: str) -> list[str]:
    """The sorted WordNet ids clip_benchmark's builder keeps for imagenet-a / -r / -o (local variables there, so read
    from its source)."""
    from clip_benchmark.datasets import builder

    variable = {"imagenet-a": "imagenet_a_wnids", "imagenet-r": "imagenet_r_wnids", "imagenet-o": "imagenet_o_wnids"}
    for node in ast.walk(ast.parse(inspect.getsource(builder))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable[name] for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    raise LookupError(f"{variable[name]} not found in clip_benchmark's builder")


def _wnid_folders(root: Path, key: str, wnids: list[str], name: Callable[[int, int], str], extra: tuple[int, ...]):
    for c, wnid in enumerate(wnids):
        for j in range(2 if c in extra else 1):
            _save(Path(root) / wnid / name(c, j), _rng(key, wnid, j))


def write_imagenet_sketch(root: Path, all_classes: bool = False) -> Path:
    """<wnid>/sketch_<n>.JPEG (the unzipped "sketch" folder): the first FEW wnids, or all 1000."""
    wnids = _all_wnids() if all_classes else _all_wnids()[:FEW]
    _wnid_folders(root, "sketch", wnids, lambda c, j: f"sketch_{j * 10 + c % 7}.JPEG", (0, 2))
    return Path(root)


def _write_subset(name: str, root: Path, all_classes: bool, file_name: Callable[[int, int], str]) -> Path:
    wnids = builder_wnids(name)
    wnids = wnids if all_classes else wnids[:FEW]
    _wnid_folders(root, name, wnids, file_name, (0, 1, len(wnids) - 1))
    return Path(root)


def write_imagenet_a(root: Path, all_classes: bool = True) -> Path:
    """<wnid>/ for the 200 ImageNet-A wnids (file names with spaces, as the real ones); all_classes=False: FEW."""
    return _write_subset("imagenet-a", root, all_classes, lambda c, j: f"0.{c * 37 + j:06d}_bird {j}_0.{c:03d}.jpg")


def write_imagenet_r(root: Path, all_classes: bool = True) -> Path:
    """<wnid>/<style>_<n>.jpg for the 200 ImageNet-R wnids; all_classes=False: FEW."""
    styles = ["art", "cartoon", "deviantart", "embroidery", "graffiti", "origami", "painting", "sketch", "toy"]
    return _write_subset("imagenet-r", root, all_classes, lambda c, j: f"{styles[(c + j) % len(styles)]}_{j}.jpg")


def write_imagenet_o(root: Path, all_classes: bool = True) -> Path:
    """<wnid>/ for the 200 ImageNet-O wnids; all_classes=False: FEW."""
    return _write_subset("imagenet-o", root, all_classes, lambda c, j: f"{c:03d}_{j}_imagenet_o.jpg")


IMAGENETV2_LABELS = [0, 1, 1, 2, 417, 999, 999, 500, 3]  # folder names = class indices; len = IMAGENETV2_COUNT


def write_imagenetv2(root: Path) -> Path:
    """ImageNetV2-matched-frequency/<class index>/<sha1>.jpeg (IMAGENETV2_COUNT files: see no_integrity_checks)."""
    assert len(IMAGENETV2_LABELS) == IMAGENETV2_COUNT
    for i, label in enumerate(IMAGENETV2_LABELS):
        digest = hashlib.sha1(f"imagenetv2/{i}".encode()).hexdigest()
        _save(Path(root) / "ImageNetV2-matched-frequency" / str(label) / f"{digest}.jpeg", _rng("imagenetv2", i))
    return Path(root)


def write_imagenet1k_unverified(root: Path, all_classes: bool = False) -> Path:
    """{train,val}/<wnid>/ (train: <wnid>_<n>.JPEG, val: ILSVRC2012_val_<n>.JPEG): the first FEW wnids, or all 1000."""
    wnids = _all_wnids() if all_classes else _all_wnids()[:FEW]
    _wnid_folders(Path(root) / "train", "unverified-train", wnids, lambda c, j: f"{wnids[c]}_{1000 + 7 * j}.JPEG",
                  (1,))
    _wnid_folders(Path(root) / "val", "unverified-val", wnids,
                  lambda c, j: f"ILSVRC2012_val_{(c * 2 + j) * 9973 % 50000 + 1:08d}.JPEG", (0, 3))
    return Path(root)


# -- retrieval ---------------------------------------------------------------------------------------------------------

_WORDS = {"color": ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"],
          "thing": ["dog", "bus", "kite", "plate of food", "bicycle", "cat", "clock tower", "surfboard"],
          "place": ["on a street", "in a park", "on a table", "near the water", "in a kitchen", "on a field"]}


def _caption(rng: np.random.RandomState) -> str:
    pick = {k: v[int(rng.randint(len(v)))] for k, v in _WORDS.items()}
    return f"A {pick['color']} {pick['thing']} {pick['place']}."


def write_mscoco_captions(root: Path) -> Path:
    """{train2014,val2014}/COCO_<folder>_<id:012d>.jpg and coco_{train,val,test}_karpathy.json (COCO caption format;
    images listed out of id order, annotations interleaved, 5 to 7 captions per image)."""
    plan = {"train": ("train2014", [57870, 384029, 222016]), "val": ("val2014", [203564, 179765, 322141]),
            "test": ("val2014", [391895, 522418, 184613, 318219])}
    ann_id = 1
    for split, (folder, ids) in plan.items():
        rng = _rng("mscoco", split)
        images, annotations = [], []
        for k, image_id in enumerate(ids):
            file_name = f"COCO_{folder}_{image_id:012d}.jpg"
            w, h = Image.open(_save(Path(root) / folder / file_name, _rng("mscoco", image_id))).size
            images.append({"license": 1, "file_name": file_name, "height": h, "width": w, "id": image_id})
            for _ in range(5 + (k == 1) + 2 * (k == 2 and split == "test")):
                annotations.append({"image_id": image_id, "id": ann_id, "caption": _caption(rng)})
                ann_id += 1
        annotations = annotations[::2] + annotations[1::2]  # interleaved across images; per image still in file order
        coco = {"info": {"description": f"COCO 2014 Karpathy {split} (fixture)"}, "licenses": [{"id": 1, "name": "x"}],
                "type": "captions", "images": images, "annotations": annotations}
        _write_text(Path(root) / f"coco_{split}_karpathy.json", json.dumps(coco))
    return Path(root)


def _multilingual_module(name: str):
    return importlib.import_module(f"clip_benchmark.datasets.{MULTILINGUAL[name][0]}")


def _localized(base: str, language: str, n: int) -> str:
    return base if language in ("en", "eng_Latn") else f"{base} [{language} {n}: ü, ç, 字]"


def _image_names(name: str) -> list[str]:
    rng = _rng(name, "names")
    if name == "crossmodal3600":
        return ["".join(f"{int(b):02x}" for b in rng.randint(0, 256, size=8)) + ".jpg" for _ in range(6)]
    if name == "flickr30k-200":
        return [f"{int(rng.randint(10**9, 5 * 10**9))}.jpg" for _ in range(6)]
    return [f"{int(rng.randint(1, 600000)):012d}.jpg" for _ in range(6)]


def write_multilingual(name: str, root: Path, language: str = "en") -> Path:
    """<folder>/images/<name>.jpg and the module's OUTPUT_FILENAME_TEMPLATE.format(language) JSON with absolute image
    paths, one caption each (crossmodal3600 also writes xm3600/captions.jsonl in every language; its JSON takes each
    image's first caption, as create_annotation_file does)."""
    module = _multilingual_module(name)
    if language not in module.SUPPORTED_LANGUAGES:
        raise ValueError(f"{name}: clip_benchmark does not support language {language!r}")
    _, folder, indices_key = MULTILINGUAL[name]
    root = Path(root)
    images = root / folder / "images"
    paths, captions = [], []
    for i, file_name in enumerate(_image_names(name)):
        paths.append(str(_save(images / file_name, _rng(name, file_name)).resolve()))
        base = _caption(_rng(name, "caption", i))
        captions.append(_localized(base, language, i))
    if name == "crossmodal3600":
        with open(root / folder / "captions.jsonl", "w", encoding="utf-8") as f:
            for i, file_name in enumerate(_image_names(name)):
                row = {"image/key": file_name.removesuffix(".jpg"), "image/locale": "en"}
                for lang in module.SUPPORTED_LANGUAGES:
                    first = _localized(_caption(_rng(name, "caption", i)), lang, i)
                    row[lang] = {"caption": [first, first + " (2)"], "caption/tokenized": [first.lower()],
                                 "caption/tokenized/lowercase": [first.lower()]}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    annotation = {"image_paths": paths, "annotations": captions, indices_key: list(range(len(paths)))}
    _write_text(root / module.OUTPUT_FILENAME_TEMPLATE.format(language), json.dumps(annotation, ensure_ascii=False))
    return root


# -- objectnet and PASCAL VOC 2007 (clip_benchmark's own readers) -----------------------------------------------------


def write_objectnet(root: Path) -> Path:
    """Five image folders, three of them mapped to (made-up) ImageNet names, as the mapping files clip_benchmark
    copies beside objectnet-1.0/; the unmapped folders must be left out."""
    labels = {"alarm_clock": "Alarm clock", "banana": "Banana", "zebra_toy": "Zebra toy", "air_freshener":
              "Air freshener", "basket": "Basket"}
    mapped = {"Alarm clock": "imagenet 3; imagenet 7", "Banana": "imagenet 9", "Basket": "imagenet 1"}
    _write_text(root / "folder_to_objectnet_label.json", json.dumps(labels))
    _write_text(root / "objectnet_to_imagenet_1k.json", json.dumps(mapped))
    _write_text(root / "pytorch_to_imagenet_2012_id.json", json.dumps({str(i): i for i in range(1000)}))
    _lines(root / "imagenet_to_label_2012_v2", [f"imagenet {i}" for i in range(1000)])
    for folder in labels:
        for n in range(2 if folder != "banana" else 3):
            _save(root / "objectnet-1.0" / "images" / folder / f"{n}.png", _rng("objectnet", folder, n))
    return root


def write_voc2007(root: Path) -> Path:
    """Three images per split, one to three annotated objects each (boxes inside the image)."""
    base = root / "VOCdevkit" / "VOC2007"
    classes = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor"]
    for offset, split in ((0, "train"), (10, "test")):
        ids = [f"{offset + i:06d}" for i in range(1, 4)]
        _lines(base / "ImageSets" / "Main" / f"aeroplane_{split}.txt", [f"{i} {1 if n % 2 else -1}"
                                                                         for n, i in enumerate(ids)])
        for n, image_id in enumerate(ids):
            rng = _rng("voc2007", split, n)
            _save(base / "JPEGImages" / f"{image_id}.jpg", rng, size=(48, 40))
            objects = []
            for k in range(1 + n % 3):
                x0, y0 = int(rng.randint(0, 20)), int(rng.randint(0, 16))
                name = classes[(3 * n + 7 * k + offset) % len(classes)]
                objects.append(f"<object><name>{name}</name><pose>Unspecified</pose><bndbox><xmin>{x0}</xmin>"
                               f"<ymin>{y0}</ymin><xmax>{x0 + 20}</xmax><ymax>{y0 + 18}</ymax></bndbox></object>")
            _write_text(base / "Annotations" / f"{image_id}.xml",
                        f"<annotation><filename>{image_id}.jpg</filename>{''.join(objects)}</annotation>")
    return root


# -- dispatcher --------------------------------------------------------------------------------------------------------

WRITERS: dict[str, Callable[[Path], Path]] = {
    "mnist": write_mnist, "stl10": write_stl10, "food101": write_food101, "sun397": write_sun397,
    "cars": write_cars, "fgvc_aircraft": write_fgvc_aircraft, "dtd": write_dtd, "pets": write_pets,
    "flowers": write_flowers, "eurosat": write_eurosat, "gtsrb": write_gtsrb, "country211": write_country211,
    "pcam": write_pcam, "renderedsst2": write_renderedsst2, "fer2013": write_fer2013, "caltech101": write_caltech101,
    "imagenet_sketch": write_imagenet_sketch, "imagenet-a": write_imagenet_a, "imagenet-r": write_imagenet_r,
    "imagenet-o": write_imagenet_o, "imagenetv2": write_imagenetv2,
    "imagenet1k-unverified": write_imagenet1k_unverified, "mscoco_captions": write_mscoco_captions,
    "objectnet": write_objectnet, "voc2007": write_voc2007, "voc2007_multilabel": write_voc2007,
}


def write_layout(name: str, root: Path, split: str = "test", language: str = "en") -> Path:
    """Write dataset ``name`` (every split it has) under ``root``; returns the folder to pass as clip_benchmark's
    ``root=``. ``split`` must be one of SPLITS[name]; ``language`` matters for the multilingual retrieval sets only
    (xtd200 and flickr30k-200 take FLORES codes such as "eng_Latn": clip_benchmark rejects "en" there)."""
    if name not in SPLITS:
        raise KeyError(f"no layout fixture for {name!r}")
    if split not in SPLITS[name]:
        raise ValueError(f"{name}: split {split!r} not in {SPLITS[name]}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if name in MULTILINGUAL:
        return write_multilingual(name, root, language)
    return WRITERS[name](root)


def task_of(name: str) -> str:
    return "zeroshot_retrieval" if name in RETRIEVAL else "zeroshot_classification"


