"""The dataset catalog: one typed record per name the lookup resolves, and `clipcache datasets` listing them all."""

from __future__ import annotations

import dataclasses

import pytest

from clipcache.tasks.datasets import SOURCES, check_name, dataset_catalog, default_task, get_source, known_names
from clipcache.tasks.datasets import sources_by_priority as by_priority
from clipcache.tasks.datasets.record import TASK_MAIN_METRIC, DatasetRecord, family_of, merge_records
from clipcache.tasks.datasets.source import DatasetRef, DatasetSource
from clipcache.tasks.evaluation import TASKS


@pytest.fixture(scope="module")
def records() -> list[DatasetRecord]:
    return dataset_catalog()


def test_every_source_of_the_lookup_has_records_and_every_name_it_knows_is_one(records):
    """The families the loop resolves (wilds/*, fairness/*, misc/winogavil, mieb:*, the folder formats under any
    name, plugins' readers) are all in the catalog: a source without a record, or a name a source suggests for a
    typo without a record, fails here."""
    listed = {source for r in records for source in r.sources}
    assert listed == set(SOURCES.names())
    names = {r.name for r in records}
    assert set(known_names()) <= names
    for source in by_priority():
        assert set(source.known_names()) <= {r.name for r in records if source.name in r.sources}, source.name
    families = {r.family for r in records}
    assert {"wilds", "fairness", "misc", "mieb", "wds", "vtab", "sugar_crepe", "folder"} <= families
    assert {"wilds/iwildcam", "fairness/geode", "fairness/fairface", "misc/winogavil", "mieb:<mteb task name>",
            "wds/<name>", "shapes", "imagenet1k", "csv_captions"} <= names  # csv_captions: the example plugin


def test_every_named_record_resolves_as_its_record_says(records, tmp_path):
    """A listed name passes the name check and --task auto gives the record's task; the source that claims it
    without a root (or, for a name read only from files, with one) is one of the record's sources."""
    root = str(tmp_path / "{dataset}")
    for record in records:
        if record.is_pattern or not record.readable:
            continue
        check_name(record.name)
        assert default_task(record.name, None) == record.task, record.name
        assert record.task in TASKS, record.name
        claimants = [s.name for s in by_priority() if s.claims(DatasetRef(record.name))
                     or s.claims(DatasetRef(record.name, root))]
        assert claimants and set(claimants) <= set(record.sources), (record.name, claimants, record.sources)


def test_pattern_records_name_their_source_and_task(records):
    patterns = [r for r in records if r.is_pattern and r.readable]
    assert {s for r in patterns for s in r.sources} >= {"mieb", "beir", "any2any", "webdataset", "hosted", "vidore",
                                                        "visual_sts", "multiple_choice", "composed_retrieval",
                                                        "multilabel"}
    for record in patterns:
        for name in record.sources:
            source = get_source(name)
            assert record.task in (*source.only_for, ""), record
            assert record.layouts or record.hosted, record
    # two sources that claim a folder under any name are two records: their tasks differ
    assert len({r.task for r in patterns if r.name == "<name>"}) == len([r for r in patterns if r.name == "<name>"])


def test_clip_benchmark_names_are_one_record_each_with_all_their_sources(records):
    by_name = {r.name: r for r in records if not r.is_pattern}
    assert len(by_name) == len([r for r in records if not r.is_pattern])
    imagenet = by_name["imagenet1k"]
    assert imagenet.sources == ("original", "webdataset", "hosted") and imagenet.hosted == "clip-benchmark/wds_imagenet1k"
    assert imagenet.splits == ("train", "test") and "en" in imagenet.languages and imagenet.main_metric == "acc1"
    assert by_name["xtd10"].languages and by_name["flickr30k"].main_metric == "mean_recall@1"
    assert by_name["muge"].note == "Chinese" and by_name["muge"].sources == ("webdataset", "hosted")
    assert by_name["imagenet-w"].sources == () and by_name["imagenet-w"].layouts[0].startswith("not read")


def test_record_is_frozen_typed_and_merges_by_name():
    a = DatasetRecord("x", "zeroshot_classification", ("original",), ("folders",), splits=("test",))
    b = DatasetRecord("x", "zeroshot_classification", ("hosted",), hosted="org/wds_x", note="n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "y"  # type: ignore[misc]
    (merged,) = merge_records([a, b])
    assert merged == DatasetRecord("x", "zeroshot_classification", ("original", "hosted"), ("folders",),
                                   hosted="org/wds_x", splits=("test",), note="n")
    assert merged.main_metric == TASK_MAIN_METRIC["zeroshot_classification"]
    beir, sts = DatasetRecord("<name>", "text_retrieval", ("beir",)), DatasetRecord("<name>", "visual_sts", ("s",))
    assert merge_records([beir, sts]) == [beir, sts]
    assert [family_of(n) for n in ("wilds/fmow", "mieb:X", "vtab_dtd", "<name>", "cifar10")] == \
        ["wilds", "mieb", "vtab", "folder", "cifar10"]


class _Lines(DatasetSource):
    """A source as a plugin would add one: a folder format of its own, one name."""

    name = "test_lines"
    description = "lines.txt: one caption a line"
    priority = 70

    def claims(self, ref: DatasetRef) -> bool:
        return ref.name == "lines/demo"

    def task(self, ref: DatasetRef) -> str:
        return "zeroshot_retrieval"

    def open(self, ref, split, limit, options):  # pragma: no cover - not opened here
        raise NotImplementedError

    def known_names(self) -> list[str]:
        return ["lines/demo"]


def test_a_new_source_is_one_registration_and_is_listed(monkeypatch, tmp_path):
    """Plugging in a source is one DatasetSource in SOURCES: the lookup, the catalog and the listing follow."""
    monkeypatch.setitem(SOURCES._entries, "test_lines", _Lines)
    monkeypatch.setitem(SOURCES._origin, "test_lines", "a test")
    check_name("lines/demo")
    assert default_task("lines/demo", None) == "zeroshot_retrieval"
    (record,) = [r for r in dataset_catalog() if r.name == "lines/demo"]
    assert record == DatasetRecord("lines/demo", "zeroshot_retrieval", ("test_lines",), ("lines.txt: one caption a "
                                                                                        "line",), origin="a test")
    from clipcache.flows.cli.catalog import catalog_rows

    assert any(row["name"] == "lines/demo" for row in catalog_rows(str(tmp_path), "huggingface"))


def test_clipcache_datasets_lists_every_record(records, tmp_path, capsys):
    """The command a user has: every record's name is a row (names wrap to one line: the widest is 36 columns)."""
    from clipcache.flows.cli import main

    assert main(["datasets", "--cache_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    shown = {line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")}
    assert {r.name for r in records} <= shown
    for family in ("wilds/iwildcam", "fairness/utkface", "misc/winogavil", "mieb:<mteb task name>", "wds/<name>"):
        assert family in shown


# -- licence, citation and reference: mteb's own TaskMetadata, read when asked -----------------------------------------

@pytest.mark.parametrize(("name", "task"), [("cifar10", "CIFAR10"), ("winoground", "Winoground"),
                                            ("sugar_crepe/swap_obj", "SugarCrepe"), ("flickr30k", "Flickr30kI2TRetrieval"),
                                            ("aro/vg_relation", "AROVisualRelation"),
                                            ("mieb:CIRRIT2IRetrieval", "CIRRIT2IRetrieval")])
def test_licence_and_citation_are_mtebs_own_metadata(name, task):
    import mteb

    from clipcache.tasks.datasets import record_of
    from clipcache.tasks.datasets.citations import cited

    meta = mteb.get_task(task).metadata
    record = cited(record_of(name))
    assert record.citation == meta.bibtex_citation.strip() and record.citation.startswith("@")
    assert record.reference == meta.reference and record.licence == ("" if meta.license == "not specified"
                                                                     else meta.license)
    assert record.facts_from == f"mteb {mteb.__version__} TaskMetadata of {task}"
    assert record.name == name and record.task == default_task(name, None)


def test_every_cited_name_is_listed_and_every_mteb_task_exists(records):
    """citations.json names only datasets the catalog has and tasks mteb has; a dataset no source states keeps
    empty fields (never a guess), and a pattern record reads nothing."""
    import mteb

    from clipcache.tasks.datasets.citations import cited, mteb_tasks

    names = {r.name for r in records}
    assert set(mteb_tasks()) <= names and "fer2013" not in mteb_tasks()
    for task in set(mteb_tasks().values()):
        assert mteb.get_task(task).metadata.bibtex_citation, task
    for record in records:
        if record.name not in mteb_tasks():
            assert cited(record) == record, record.name
    assert [r.licence for r in records] == [""] * len(records)  # the listing reads nothing


def test_datasets_details_and_json_show_the_facts_and_their_source(tmp_path, capsys):
    import json

    import mteb

    from clipcache.flows.cli import main
    assert main(["datasets", "--details", "mieb:CIFAR10ZeroShot"]) == 0
    out = capsys.readouterr().out
    assert "sources:     mieb" in out and f"facts from:  mteb {mteb.__version__} TaskMetadata of CIFAR10ZeroShot" in out
    assert "Learning multiple layers of features from tiny images" in out
    assert all(len(line) <= 80 for line in out.split("citation:")[0].splitlines())
    assert main(["datasets", "--details", "cifar1O"]) != 0
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "Unknown dataset 'cifar1O'. Did you mean: cifar10" in line

    assert main(["datasets", "--format", "json", "--cache_dir", str(tmp_path)]) == 0
    rows = {(r["name"], r["task"]): r for r in json.loads(capsys.readouterr().out)}
    winoground = rows["winoground", "image_caption_selection"]
    assert winoground["licence"] == mteb.get_task("Winoground").metadata.license
    assert winoground["sources"] == ["registered"] and rows["wilds/fmow", "zeroshot_classification"]["citation"] == ""
