"""Group-metadata sets in their ORIGINAL layouts (issue #27 item 3): FMoW (WILDS' fmow_v1.1), GeoDE, Dollar Street,
FairFace and UTKFace read from their own files give the same metadata codes and class indices as DataComp's
webdataset copy of the same samples, and `clipcache eval` gives the same group metrics from either layout.

Each tiny original copy is written with its expected codes worked out in the test: FMoW's with pandas, as WILDS'
FMoWDataset computes them (first-seen regions over the whole CSV, UTC years), the others by the tables of DataComp's
fairness_tables.py and the documented groupings. The equivalent DataComp copy is written from those codes."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest

from clipcache import connect
from clipcache.storage.errors import DatasetError
from clipcache.tasks.datasets import open_dataset
from clipcache.tasks.datasets.datacomp.group_layouts import group_layouts

from hostile import assert_refused, run_cli

FACE_HEADS = {"race": 7, "gender": 2, "age": 9, "toxic": 20}


def _images(n: int):
    from clipcache.tasks.datasets import shapes

    ds = shapes.load_shapes("fixture", "zeroshot_classification", "test", n)
    return [ds.load_image(i) for i in range(n)], shapes


def _prompts(root, classnames: list[str], templates: list[str]) -> None:
    (root / "classnames.txt").write_text("\n".join(classnames) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(templates) + "\n")


def _face_prompts(root, shapes) -> None:
    _prompts(root, [f"{o}:{c}" for o, k in FACE_HEADS.items() for c in shapes.CLASSNAMES[:k]],
             [f"{o}:{t}" for o in FACE_HEADS for t in shapes.TEMPLATES[:2]])


def write_copy(root, files: list, labels, codes: np.ndarray, prompts_from) -> None:
    """DataComp's webdataset copy: one shard, each sample the original image file's bytes (so that both layouts
    decode the same pixels), <key>.cls (classified sets) and <key>.npy."""
    import webdataset as wds

    (root / "test").mkdir(parents=True)
    with wds.TarWriter(str(root / "test" / "0.tar")) as sink:
        for i, path in enumerate(files):
            buf = io.BytesIO()
            np.save(buf, codes[i])
            sample = {"__key__": f"s{i:04d}", "npy": buf.getvalue(), path.name.rsplit(".", 1)[1]: path.read_bytes()}
            if labels is not None:
                sample["cls"] = str(int(labels[i]))
            sink.write(sample)
    (root / "test" / "nshards.txt").write_text("1\n")
    for name in ("classnames.txt", "zeroshot_classification_templates.txt"):
        (root / name).write_bytes((prompts_from / name).read_bytes())


# -- the original layouts, each with the codes DataComp's copy holds ------------------------------------------------

FMOW_CATEGORIES = group_layouts()["wilds/fmow"]["original"]["label"]["classes"]


def write_fmow(root, n: int = 24, seed: int = 0):
    """WILDS' fmow_v1.1 folder. Returns (labels, codes) of the OOD test split, computed as FMoWDataset does."""
    rng = np.random.default_rng(seed)
    folder = root / "fmow_v1.1"
    (folder / "images").mkdir(parents=True)
    images, _ = _images(n)
    countries = ["USA", "FRA", "KEN", "JPN", "XXX", ""]  # XXX and no code: WILDS' "Other"
    times = ["2010-03-01T10:00:00Z", "2016-05-01T10:00:00Z", "2017-12-31T23:59:59.500Z",
             "2015-12-31T23:00:00-02:00", "2014-07-07T07:07:07Z", "2016-01-01T00:00:00+00:00"]
    rows = [{"split": str(rng.choice(["test", "test", "train", "val", "seq"])),
             "category": FMOW_CATEGORIES[int(rng.integers(0, 62))], "country_code": str(rng.choice(countries)),
             "timestamp": str(rng.choice(times)), "img_filename": f"x{i}.jpg"} for i in range(n)]
    pd.DataFrame(rows).to_csv(folder / "rgb_metadata.csv", index=False)
    (folder / "country_code_mapping.csv").write_text(
        "name,alpha-2,alpha-3,region\nUnited States,US,USA,Americas\nFrance,FR,FRA,Europe\n"
        "Kenya,KE,KEN,Africa\nJapan,JP,JPN,Asia\n")
    for i in range(n):
        images[i].save(folder / "images" / f"rgb_img_{i}.png")
    _prompts(root, [c.replace("_", " ") for c in FMOW_CATEGORIES], ["a satellite photo of a {c}."])
    # the reference: WILDS' recipe in pandas
    meta = pd.read_csv(folder / "rgb_metadata.csv")
    mapping = pd.read_csv(folder / "country_code_mapping.csv")
    region_of = dict(zip(mapping["alpha-3"], mapping["region"], strict=True))
    regions = [region_of.get(c, "Other") for c in meta["country_code"].to_list()]
    order = list(pd.Series(regions).unique())
    ts = pd.to_datetime(meta["timestamp"], utc=True, format="ISO8601")
    test = (meta["split"] == "test") & (ts >= pd.Timestamp("2016-01-01", tz="UTC"))
    idx = np.flatnonzero(test.to_numpy())
    labels = np.array([FMOW_CATEGORIES.index(c) for c in meta["category"]])[idx]
    codes = np.stack([np.array([order.index(r) for r in regions])[idx], (ts.dt.year.to_numpy() - 2002)[idx],
                      labels], axis=1)
    return [f"images/rgb_img_{i}.png" for i in idx], labels, codes


GEODE_REGIONS = ["Africa", "Americas", "EastAsia", "Europe", "SouthEastAsia", "WestAsia"]


def write_geode(root, n: int = 24, seed: int = 1):
    rng = np.random.default_rng(seed)
    images, shapes = _images(n)
    classes = shapes.CLASSNAMES[:8]
    countries = ["Nigeria", "Japan", "Mexico", "Italy", "Indonesia"]
    rows = []
    for i in range(n):
        region = str(rng.choice(GEODE_REGIONS))
        obj = classes[int(rng.integers(0, 8))]
        rows.append({"file_path": f"images/{obj.replace(' ', '_')}/{i}.jpg", "object": obj.replace(" ", "_"),
                     "region": region, "ip_country": str(rng.choice(countries))})
        (root / "images" / obj.replace(" ", "_")).mkdir(parents=True, exist_ok=True)
        images[i].save(root / rows[-1]["file_path"])
    pd.DataFrame(rows).to_csv(root / "index.csv", index=False)
    _prompts(root, classes, shapes.TEMPLATES)
    labels = np.array([classes.index(r["object"].replace("_", " ")) for r in rows])
    present = sorted({r["ip_country"] for r in rows})
    codes = np.array([[GEODE_REGIONS.index(r["region"]), present.index(r["ip_country"])] for r in rows])
    return [r["file_path"] for r in rows], labels, codes


def write_dollar_street(root, n: int = 24, seed: int = 2):
    rng = np.random.default_rng(seed)
    images, shapes = _images(n)
    classes = shapes.CLASSNAMES[:10]
    incomes = [27, 60, 61, 195, 196, 243, 244, 685, 686, 973, 974, 1963, 1964, 10098]
    rows = []
    for i in range(n):
        topic = classes[int(rng.integers(0, 10))]
        rows.append({"id": f"5d4b{i:04d}", "country.name": "x", "region.id": str(rng.choice(["af", "am", "as", "eu"])),
                     "topics": f"['not a class', '{topic}']", "income": int(rng.choice(incomes)),
                     "imageRelPath": f"assets/{i}.jpg"})
        (root / "assets").mkdir(exist_ok=True)
        images[i].save(root / rows[-1]["imageRelPath"])
    pd.DataFrame(rows).to_csv(root / "images_v2_imagenet_test.csv", index=False)
    _prompts(root, classes, shapes.TEMPLATES)
    labels = np.array([classes.index(r["topics"].split("'")[3]) for r in rows])
    meta_edges, ds_edges = [195, 685, 1963], [2 * 365 / 12, 8 * 365 / 12, 32 * 365 / 12]
    codes = np.array([[int(np.searchsorted(ds_edges, r["income"], side="left")),
                       int(np.searchsorted(meta_edges, r["income"], side="left")),
                       ["af", "am", "as", "eu"].index(r["region.id"])] for r in rows])
    return [r["imageRelPath"] for r in rows], labels, codes


FAIRFACE_RACES = ["Black", "White", "Indian", "Latino_Hispanic", "Middle Eastern", "Southeast Asian", "East Asian"]
FAIRFACE_AGES = ["0-2", "3-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60-69", "more than 70"]


def write_fairface(root, n: int = 28, seed: int = 3):
    rng = np.random.default_rng(seed)
    images, shapes = _images(n)
    (root / "val").mkdir(parents=True)
    rows = [{"file": f"val/{i + 1}.jpg", "age": str(rng.choice(FAIRFACE_AGES)),
             "gender": str(rng.choice(["Male", "Female"])), "race": str(rng.choice(FAIRFACE_RACES)),
             "service_test": str(rng.choice(["True", "False"]))} for i in range(n)]
    for i in range(n):
        images[i].save(root / rows[i]["file"])
    pd.DataFrame(rows).to_csv(root / "fairface_label_val.csv", index=False)
    _face_prompts(root, shapes)
    race = np.array([FAIRFACE_RACES.index(r["race"]) for r in rows])
    codes = np.stack([[FAIRFACE_AGES.index(r["age"]) for r in rows], [r["gender"] == "Female" for r in rows],
                      race, race != 1], axis=1).astype(np.int64)
    return [r["file"] for r in rows], None, codes


UTK_TO_DATACOMP_RACE = {0: 1, 1: 0, 2: 3, 3: 2, 4: 4}  # White, Black, Asian, Indian, Others -> DataComp's order


def write_utkface(root, n: int = 24, seed: int = 4):
    rng = np.random.default_rng(seed)
    images, shapes = _images(n)
    (root / "UTKFace").mkdir(parents=True)
    ages = [1, 2, 3, 9, 10, 19, 20, 45, 69, 70, 116]
    names = []
    for i in range(n):
        chip = ".chip.jpg" if i % 3 == 0 else ""
        names.append(f"{int(rng.choice(ages))}_{int(rng.integers(0, 2))}_{int(rng.integers(0, 5))}_"
                     f"2017011{i % 10}17452{i:04d}.jpg{chip}")
        images[i].save(root / "UTKFace" / names[-1], format="JPEG")
    _face_prompts(root, shapes)
    names = sorted(names)
    fairface_range = [(0, 2), (3, 9), (10, 19), (20, 29), (30, 39), (40, 49), (50, 59), (60, 69), (70, 999)]
    parts = [[int(p) for p in name.split("_")[:3]] for name in names]
    codes = np.array([[next(k for k, (lo, hi) in enumerate(fairface_range) if lo <= age <= hi), gender,
                       UTK_TO_DATACOMP_RACE[race], int(UTK_TO_DATACOMP_RACE[race] != 1)]
                      for age, gender, race in parts])
    return names, None, codes


WRITERS = {"wilds/fmow": write_fmow, "fairness/geode": write_geode, "fairness/dollar_street": write_dollar_street,
           "fairness/fairface": write_fairface, "fairness/utkface": write_utkface}
FOLDERS = {"wilds/fmow": "fmow_v1.1", "fairness/utkface": "UTKFace"}  # the folder the sample keys are relative to


def build(base, name: str, **options):
    """The original layout under base/orig/<name> and DataComp's copy of the same samples under base/copy/<name>."""
    cleaned = name.replace("/", "-")
    original, copy = base / "orig" / cleaned, base / "copy" / cleaned
    original.mkdir(parents=True)
    keys, labels, codes = WRITERS[name](original, **options)
    write_copy(copy, [original / FOLDERS.get(name, ".") / k for k in keys], labels, codes, original)
    return original, copy, keys, labels, codes


@pytest.mark.parametrize("name", list(WRITERS))
def test_original_layout_gives_datacomps_codes_and_classes(tmp_path, name):
    original, copy, keys, labels, codes = build(tmp_path, name)
    from_original = open_dataset(name, str(original), "test", None)
    from_copy = open_dataset(name, str(copy), "test", None)
    assert np.array_equal(from_original.codes, codes) and np.array_equal(from_copy.codes, codes)
    if labels is not None:
        assert np.array_equal(from_original.labels, labels) and np.array_equal(from_copy.labels, labels)
    else:
        assert from_original.labels is None and [h.objective for h in from_original.heads()] == list(FACE_HEADS)
    meta = from_original.sample_metadata()
    assert meta.keys == keys
    assert meta.layout == group_layouts()[name]["original"]["layout"]
    assert {f: list(v) for f, v in meta.codes.items()} == {f: list(v) for f, v in from_copy.sample_metadata().codes.items()}
    assert len(open_dataset(name, str(original), "test", 3)) == 3


def test_fmow_splits_are_wilds_time_splits(tmp_path):
    write_fmow(tmp_path, n=40)
    meta = pd.read_csv(tmp_path / "fmow_v1.1" / "rgb_metadata.csv")
    ts = pd.to_datetime(meta["timestamp"], utc=True, format="ISO8601")
    start, cut = pd.Timestamp("2013-01-01", tz="UTC"), pd.Timestamp("2016-01-01", tz="UTC")
    expected = {"val": (meta["split"] == "val") & (ts >= start) & (ts < cut),
                "id_test": (meta["split"] == "test") & (ts < start),
                "train": (meta["split"] == "train") & (ts < start)}
    for split, mask in expected.items():
        if not mask.any():
            with pytest.raises(DatasetError, match="no row of split"):
                open_dataset("wilds/fmow", str(tmp_path), split, None)
            continue
        ds = open_dataset("wilds/fmow", str(tmp_path), split, None)
        assert [p.name for p in ds.image_paths] == [f"rgb_img_{i}.png" for i in np.flatnonzero(mask.to_numpy())]


# -- bad input: one line naming the file and the row ---------------------------------------------------------------

def _edit_csv(path, row: int, column: str, value: str) -> None:
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table.loc[row, column] = value
    table.to_csv(path, index=False)


def _edit_first_test(path, column: str, value: str) -> int:
    first = int(np.flatnonzero(pd.read_csv(path, dtype=str)["split"] == "test")[0])
    _edit_csv(path, first, column, value)
    return first


@pytest.mark.parametrize("name, edit, phrase", [
    ("fairness/geode", lambda r: _edit_csv(r / "index.csv", 2, "region", "Atlantis"),
     "index.csv line 4: region 'Atlantis' is not one of Africa"),
    ("fairness/geode", lambda r: _edit_csv(r / "index.csv", 1, "object", "spaceship"),
     "index.csv line 3: object 'spaceship' is not a class of classnames.txt"),
    ("fairness/geode", lambda r: _edit_csv(r / "index.csv", 0, "file_path", "../../etc/passwd"),
     "index.csv line 2: image '../../etc/passwd' is not a path inside"),
    ("fairness/fairface", lambda r: (r / "val" / "3.jpg").unlink(), "fairface_label_val.csv line 4: image"),
    ("fairness/fairface", lambda r: _edit_csv(r / "fairface_label_val.csv", 0, "gender", "Other"),
     "fairface_label_val.csv line 2: gender 'Other' is not one of Male, Female"),
    ("fairness/dollar_street", lambda r: _edit_csv(r / "images_v2_imagenet_test.csv", 0, "income", "lots"),
     "images_v2_imagenet_test.csv line 2: income 'lots' is not a number"),
    ("fairness/utkface", lambda r: (r / "UTKFace" / "39_1_20170116174525125.jpg.chip.jpg").write_bytes(b""),
     "39_1_20170116174525125.jpg.chip.jpg: file name is not"),
    ("fairness/utkface", lambda r: (r / "UTKFace" / "39_1_7_20170116174525125.jpg").write_bytes(b""),
     "race '7' is not one of 0, 1, 2, 3, 4"),
    ("wilds/fmow", lambda r: _edit_first_test(r / "fmow_v1.1" / "rgb_metadata.csv", "timestamp", "yesterday"),
     "timestamp 'yesterday' is not an ISO 8601"),
])
def test_a_bad_row_is_one_line_naming_the_file_and_row(tmp_path, capsys, name, edit, phrase):
    root = tmp_path / "orig"
    root.mkdir()
    WRITERS[name](root)
    edit(root)
    code, _, err = run_cli(["eval", "--model", "tiny-shapes-clip", "--dataset", name, "--dataset_root", str(root),
                            "--output_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
                            "--quiet", "--orchestrator", "local"], capsys)
    assert_refused(code, err, phrase)


def test_fmow_year_outside_wilds_years_and_missing_prompts(tmp_path):
    write_fmow(tmp_path)
    path = tmp_path / "fmow_v1.1" / "rgb_metadata.csv"
    first_test = _edit_first_test(path, "timestamp", "2019-02-02T00:00:00Z")
    with pytest.raises(DatasetError, match=f"line {first_test + 2}: timestamp year 2019 is outside WILDS' years"):
        open_dataset("wilds/fmow", str(tmp_path), "test", None)
    (tmp_path / "classnames.txt").unlink()
    with pytest.raises(DatasetError, match="classnames.txt is missing"):
        open_dataset("wilds/fmow", str(tmp_path), "test", None)


def test_a_set_without_splits_has_only_test(tmp_path):
    write_geode(tmp_path)
    with pytest.raises(DatasetError, match="split 'train': this layout has one split, 'test'"):
        open_dataset("fairness/geode", str(tmp_path), "train", None)


def test_without_any_layout_the_error_names_the_original_too(tmp_path):
    with pytest.raises(DatasetError, match="wds_fairness-geode_test.*original layout.*index.csv"):
        open_dataset("fairness/geode", str(tmp_path), "test", None)


# -- end to end: the same group metrics from either layout ----------------------------------------------------------

def evaluate_both(base, names: list[str]) -> dict[str, dict[str, tuple[dict, dict, list]]]:
    """`clipcache eval` of ``names`` from each layout: layout -> dataset -> (group_metrics rows in SQL, the result
    JSON's metrics, the layouts of the metadata rows)."""
    from clipcache.flows.cli import main

    for name in names:
        build(base / "data", name, n=12)
    found: dict[str, dict[str, tuple[dict, dict, list]]] = {}
    for layout in ("orig", "copy"):
        out = base / f"out_{layout}"
        assert main(["eval", "--model", "tiny-shapes-clip", "--dataset", *names, "--output_dir", str(out),
                     "--cache_dir", str(base / "cache"), "--quiet", "--orchestrator", "local",
                     "--dataset_root", str(base / "data" / layout / "{dataset_cleaned}")]) == 0
        con = connect(str(out))
        saved = {p["dataset"]: p["metrics"] for path in out.rglob("*.json")
                 if isinstance(p := json.loads(path.read_text()), dict) and "dataset" in p and "metrics" in p}
        found[layout] = {}
        for name in names:
            experiment = con.execute("SELECT DISTINCT experiment_id FROM metrics WHERE dataset = ?",
                                     [name]).fetchone()[0]
            in_sql = dict(con.execute("SELECT metric, value FROM group_metrics WHERE experiment_id = ?",
                                      [experiment]).fetchall())
            layouts = con.execute("SELECT DISTINCT layout FROM sample_metadata WHERE dataset = ?", [name]).fetchall()
            found[layout][name] = (in_sql, saved[name], layouts)
    return found


def assert_same_metrics(found, name: str) -> None:
    sql_original, json_original, layouts = found["orig"][name]
    sql_copy, json_copy, _ = found["copy"][name]
    assert sql_original and set(sql_original) == set(sql_copy)
    assert sql_original == pytest.approx(sql_copy, abs=1e-12)
    assert json_original == pytest.approx(json_copy, abs=1e-12)
    assert layouts == [(group_layouts()[name]["original"]["layout"],)]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    return evaluate_both(tmp_path_factory.mktemp("originals"), list(WRITERS))


@pytest.mark.parametrize("name", list(WRITERS))
def test_group_metrics_are_the_same_from_either_layout(evaluated, name):
    assert_same_metrics(evaluated, name)
