"""`clipcache report --compare A B` end to end, and the report's interval bars.

Two experiments on the bundled shapes data (the bundled model and a copy with noise on its image tower, as in
tests/test_compare.py), their comparison pages rendered in headless Chromium: no console message, every image
decoded, and the flip counts on the page equal to SQL over the warehouse's samples view.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest

from clipcache.storage.warehouse import connect

from conftest import perturbed_tiny_model
from hostile import Tree, assert_refused, run_cli

COMMON = ["--dataset", "shapes", "shapes_retrieval", "--quiet", "--orchestrator", "local", "--limit", "250"]
# After the page has loaded: every image decoded (naturalWidth > 0) or not, written into the DOM for --dump-dom.
IMAGE_CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const bad = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src"));
  const out = document.createElement("pre");
  out.id = "image-check";
  out.textContent = JSON.stringify({images: images.length, bad: bad});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The bundled model and a perturbed copy, each evaluated on the first 250 images of shapes (classification)
    and of shapes_retrieval."""
    from clipcache.flows.cli import main

    root = tmp_path_factory.mktemp("report-compare")
    perturbed = root / "perturbed"
    perturbed_tiny_model(perturbed)
    dirs = ["--output_dir", str(root / "out"), "--cache_dir", str(root / "cache")]
    assert main(["eval", "--model", "tiny-shapes-clip", f"local-dir:{perturbed}", *COMMON, *dirs]) == 0
    return root


def chromium_dom(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The page's DOM after load (with IMAGE_CHECK added, in a copy beside it so relative paths hold) and the
    console messages Chromium logged."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed here (apt-get install chromium)")
    checked = page.with_name(f"_checked_{page.name}")
    checked.write_text(page.read_text(encoding="utf-8").replace("</body>", IMAGE_CHECK + "</body>"), encoding="utf-8")
    try:
        done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                               "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
                              check=True, capture_output=True, text=True, timeout=120)
    finally:
        checked.unlink()
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def image_check(dom: str) -> dict:
    import html
    import json

    found = re.search(r'<pre id="image-check">(.*?)</pre>', dom, re.S)
    assert found, "the page's load event never ran"
    return json.loads(html.unescape(found.group(1)))


def count(dom: str, element_id: str) -> int:
    found = re.search(rf"id=\"{element_id}\">(\d+)<", dom)
    assert found, f"no #{element_id} on the page"
    return int(found.group(1))


def sql_flips(con, a_id: str, b_id: str) -> dict[str, tuple[int, int]]:
    """Per unit, the samples A gets right and B wrong, and the reverse: straight from the samples view."""
    rows = con.execute(
        "SELECT a.unit, count(*) FILTER (a.correct1 AND NOT b.correct1), count(*) FILTER (b.correct1 AND NOT "
        "a.correct1) FROM latest_samples a JOIN latest_samples b USING (unit, sample_index) "
        "WHERE a.experiment_id = ? AND b.experiment_id = ? GROUP BY a.unit", [a_id, b_id]).fetchall()
    return {unit: (a_only, b_only) for unit, a_only, b_only in rows}


@pytest.mark.slow
def test_compare_pages_in_a_real_browser(work, tmp_path, capsys):
    from PIL import Image

    out, pages = work / "out", tmp_path / "pages"
    before = Tree(work)  # the results, the cache and the models: the pages are written elsewhere only
    code, stdout, err = run_cli(["report", "--output_dir", str(out), "--compare", "tiny-shapes-clip", "perturbed",
                                 "--out", str(pages)], capsys)
    assert code == 0, err
    index = pages / "index.html"
    assert str(index) in stdout
    assert before.changes() == (set(), set(), set())

    con = connect(out)
    experiments = dict(con.sql(
        "SELECT a.dataset, [a.experiment_id, b.experiment_id] FROM (SELECT DISTINCT dataset, experiment_id FROM "
        "metrics WHERE model = 'tiny-shapes-clip') a JOIN (SELECT DISTINCT dataset, experiment_id FROM metrics "
        "WHERE model = 'perturbed') b USING (dataset)").fetchall())
    assert set(experiments) == {"shapes", "shapes_retrieval"}
    expected = {dataset: sql_flips(con, *ids) for dataset, ids in experiments.items()}
    assert set(expected["shapes"]) == {"image"} and set(expected["shapes_retrieval"]) == {"text_query", "image_query"}
    # classification's flips are the sample_flips macro's
    assert con.execute("SELECT count(*) FILTER (baseline_correct1), count(*) FILTER (candidate_correct1) FROM "
                       "sample_flips(?, ?)", experiments["shapes"]).fetchone() == expected["shapes"]["image"]
    assert expected["shapes"]["image"][0] > 0 and sum(expected["shapes_retrieval"]["text_query"]) > 0

    dom, console = chromium_dom(index, tmp_path / "profile")
    assert console == []
    links = {name: href for href, name in re.findall(r'<a href="([^"]+\.html)">(\w+)</a>', dom)}
    assert set(links) == {"shapes", "shapes_retrieval"}
    thumbnails: set[str] = set()
    for dataset, link in links.items():
        stem = link.removesuffix(".html")
        for unit, (a_only, b_only) in expected[dataset].items():
            assert (count(dom, f"{stem}-{unit}-a-only"), count(dom, f"{stem}-{unit}-b-only")) == (a_only, b_only)

        page_dom, console = chromium_dom(pages / link, tmp_path / "profile")
        assert console == []
        check = image_check(page_dom)  # every thumbnail on the page decoded in the browser
        assert check["bad"] == [] and check["images"] > 0
        for unit, (a_only, b_only) in expected[dataset].items():
            # the counts on the dataset's page are SQL's; at most 50 each way get a row
            assert (count(page_dom, f"{unit}-a-only"), count(page_dom, f"{unit}-b-only")) == (a_only, b_only)
            section = re.search(rf'<section class="unit" data-unit="{unit}">(.*?)</section>', page_dom, re.S)
            assert section and section.group(1).count("<tr><td>") == min(a_only, 50) + min(b_only, 50)
        sources = re.findall(r'<img class="thumb[^"]*" src="([^"]+)"', page_dom)
        assert len(sources) == check["images"]
        thumbnails |= set(sources)
        for src in set(sources):  # small JPEGs made from the dataset, beside the pages
            with Image.open(pages / src) as img:
                assert img.format == "JPEG" and max(img.size) <= 96
        if dataset == "shapes":  # each row: the target's class name and both sides' five best classes, by name
            from clipcache.tasks.datasets.shapes import CLASSNAMES

            for row in re.findall(r"<tr><td><img.*?</tr>", page_dom, re.S):
                names = re.findall(r"<li[^>]*>([^<]+)</li>", row)
                assert len(names) == 10 and set(names) <= set(CLASSNAMES)
        else:  # a text query's row: its caption, its image, both sides' three best images
            rows = re.findall(r"<tr><td>([^<]+)</td><td><img.*?</tr>", page_dom, re.S)
            assert rows and all(len(caption) > 5 for caption in rows)
    files = {p.relative_to(pages).as_posix() for p in pages.rglob("*") if p.is_file()}
    assert files == {"index.html", *links.values(), ".clipcache-compare.json", *thumbnails}


@pytest.mark.slow
def test_flips_beyond_the_cap_are_counted_and_the_folder_is_replaced(work, tmp_path, capsys):
    out, pages = work / "out", tmp_path / "pages"
    argv = ["report", "--output_dir", str(out), "--compare", "tiny-shapes-clip", "perturbed", "--out", str(pages)]
    assert run_cli([*argv, "--max_flips", "3"], capsys)[0] == 0
    [page] = pages.glob("*-shapes_test_*.html")
    text = page.read_text()
    a_only, b_only = (int(re.search(rf"id='image-{side}-only'>(\d+)<", text).group(1)) for side in "ab")
    assert a_only > 3 and f"{a_only - 3} more not shown" in text
    thumbs = pages / "thumbs" / page.stem
    assert len(list(thumbs.glob("*.jpg"))) == 3 + min(3, b_only)
    # a second report replaces the first as a whole (no thumbnail of the old one is left)
    assert run_cli([*argv, "--max_flips", "1"], capsys)[0] == 0
    assert len(list(thumbs.glob("*.jpg"))) == 1 + min(1, b_only)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no staging folder left beside it


def test_compare_report_refusals(work, tmp_path, capsys):
    out = work / "out"
    base = ["report", "--output_dir", str(out), "--compare"]
    assert_refused(*run_cli([*base, "nope", "perturbed"], capsys)[::2], "no completed experiment matches 'nope'")
    assert_refused(*run_cli([*base, "tiny-shapes-clip", "perturbed", "--out", str(out / "warehouse" / "pages")],
                            capsys)[::2], "inside the results warehouse")
    assert_refused(*run_cli([*base, "tiny-shapes-clip", "perturbed", "--out", str(out)], capsys)[::2],
                   "holds the results warehouse")
    assert_refused(*run_cli([*base, "tiny-shapes-clip", "perturbed", "--out", str(work / "cache" / "x")],
                            capsys)[::2], "inside the embedding cache")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert_refused(*run_cli([*base, "tiny-shapes-clip", "perturbed", "--out", str(mine)], capsys)[::2],
                   "did not write")
    assert (mine / "notes.txt").read_text() == "keep me"
    (tmp_path / "file.html").write_text("x")
    assert_refused(*run_cli([*base, "tiny-shapes-clip", "perturbed", "--out", str(tmp_path / "file.html")],
                            capsys)[::2], "is a file")


def test_leaderboard_values_carry_their_interval_bars(tmp_path):
    """render_report over marts with one value that has an interval and one that has none (the mean of two
    retrieval recalls): the first gets a whisker and its numbers, the second renders as before."""
    from clipcache.tasks.report.html import render_report

    database = tmp_path / "reports.duckdb"
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE model_summary AS SELECT 'm' AS model, NULL::VARCHAR AS pretrained, "
                "'zeroshot_classification' AS task, 1 AS n_datasets, 0.9::DOUBLE AS macro_average, now() AS newest_result")
    con.execute("CREATE TABLE leaderboard AS SELECT * FROM (VALUES "
                "('m', 'cls', 'zeroshot_classification', 'acc1', 0.9::DOUBLE, 100, 'r1', now(), 0.84::DOUBLE, "
                "0.95::DOUBLE), ('m', 'ret', 'zeroshot_retrieval', 'mean_retrieval_recall@5', 0.7, 50, 'r1', now(), "
                "NULL, NULL)) "
                "t(model_label, dataset_label, task, main_metric, main_value, n_samples, run_id, created_at, "
                "ci_low, ci_high)")
    con.execute("CREATE TABLE retrieval_curves AS SELECT 'm' AS model_label, 'ret' AS dataset_label, "
                "'image' AS direction, 5 AS k, 0.7::DOUBLE AS value")
    con.execute("CREATE TABLE metric_history AS SELECT now() AS created_at, 'm' AS model, NULL AS pretrained, "
                "'cls' AS dataset, 'acc' AS metric, 1 AS k, NULL::DOUBLE AS previous_value, 0.9::DOUBLE AS value, "
                "NULL::DOUBLE AS delta, false AS regressed, false AS improved")
    con.close()
    page = render_report(database, tmp_path / "index.html").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>m</td><td>(cls|ret)</td>.*?</tr>", page)}
    assert 'aria-label="95% interval 0.8400 to 0.9500"' in rows["cls"] and "0.8400–0.9500" in rows["cls"]
    assert "<svg" not in rows["ret"] and '<td class="num">0.7000</td>' in rows["ret"]



@pytest.fixture(scope="module")
def caption_pages(tmp_path_factory):
    """Two captioning experiments of the tiny random CoCa (tests/test_captioning.py), its own generated captions and
    a user's captions file, with markup in one reference and one caption, and `report --compare` of the two."""
    import json

    from test_captioning import write_tiny_coca

    from clipcache.flows.cli import main

    from conftest import write_image_queries

    root = tmp_path_factory.mktemp("caption-pages")
    model = write_tiny_coca(root / "tiny-coca")
    data = write_image_queries(root / "data", n=4)
    lines = [json.loads(x) for x in (data / "image_queries.jsonl").read_text().splitlines()]
    lines[0]["query"] = [*lines[0]["query"], "<b>a shape</b> & 'more'"]
    (data / "image_queries.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    mine = ["<script>alert(1)</script>", *(line["query"][0] for line in lines[1:])]
    (root / "mine.jsonl").write_text("".join(json.dumps({"image": Path(line["image_path"]).name, "caption": c}) + "\n"
                                             for line, c in zip(lines, mine, strict=True)))
    out = root / "out"
    common = ["eval", "--model", model, "--dataset", "custom", "--dataset_root", str(data), "--task", "captioning",
              "--caption_metrics", "clipscore", "--caption_seq_len", "8", "--quiet", "--orchestrator", "local",
              "--output_dir", str(out), "--cache_dir", str(root / "cache")]
    assert main(common) == 0 and main([*common, "--caption_source", str(root / "mine.jsonl")]) == 0
    con = connect(out)
    ids = dict(con.sql("SELECT DISTINCT json_extract_string(task_options, '$.caption_source') IS NOT NULL, "
                       "experiment_id FROM metrics WHERE task = 'captioning'").fetchall())
    assert main(["report", "--output_dir", str(out), "--compare", ids[False], ids[True], "--out",
                 str(root / "pages")]) == 0
    return {"root": root, "pages": root / "pages", "con": con, "ids": ids, "lines": lines, "mine": mine}


def test_captioning_compare_page_shows_each_image_with_both_captions_and_its_references(caption_pages):
    """The index links a page on which each image has both captions and its references, as text, and each side's
    scores equal to the warehouse's rows, the largest difference first."""
    import html

    pages, ids, mine = caption_pages["pages"], caption_pages["ids"], caption_pages["mine"]
    stored = caption_pages["con"].execute(
        "SELECT sample_index, baseline_caption, candidate_caption, reference_captions, baseline_value, "
        "candidate_value FROM caption_pairs(?, ?) WHERE unit = 'caption_clipscore' ORDER BY sample_index",
        [ids[False], ids[True]]).fetchall()
    assert [r[2] for r in stored] == mine and [r[3] for r in stored] == [x["query"] for x in caption_pages["lines"]]
    assert all(len(r[1]) > 0 for r in stored)  # the CoCa's own captions
    index = (pages / "index.html").read_text()
    [link] = re.findall(r"<a href='([^']+\.html)'>custom</a></td><td>captioning</td><td>captions</td>"
                        r"<td class='num'>4</td>", index)
    page = (pages / link).read_text()
    assert "<script>" not in page and "<b>" not in page
    rows = re.findall(r"<tr><td><img class='thumb' src='([^']+)'[^>]*></td><td>([^<]*)</td><td>([^<]*)</td>"
                      r"<td><ul class='refs'>(.*?)</ul></td>((?:<td class='num'>[^<]*</td>)+)</tr>", page)
    shown = {html.unescape(b): (src, html.unescape(a), [html.unescape(r) for r in re.findall(r"<li>([^<]*)</li>",
                                                                                           refs)],
                                re.findall(r"<td class='num'>([^<]*)</td>", scores)) for src, a, b, refs, scores in rows}
    assert len(rows) == 4 and set(shown) == set(mine)
    for i, a, b, refs, va, vb in stored:
        src, a_shown, refs_shown, scores = shown[b]
        assert (a_shown, refs_shown) == (a, refs)
        assert (pages / src).is_file() and src.endswith(f"/{i}.jpg")
        assert scores[:2] == [f"{va:.4f}", f"{vb:.4f}"]  # clipscore's columns come first (the rows' order)
    gaps = {b: abs(vb - va) for _, _, b, _, va, vb in stored}
    assert [gaps[html.unescape(b)] for _, _, b, _, _ in rows] == sorted(gaps.values(), reverse=True)


@pytest.mark.slow
def test_captioning_compare_page_in_a_real_browser(caption_pages, tmp_path):
    """Chromium loads the page without a console message, decodes every thumbnail, and shows the markup of a
    caption and a reference as text."""
    pages = caption_pages["pages"]
    [link] = re.findall(r"<a href='([^']+\.html)'>custom</a>", (pages / "index.html").read_text())
    dom, console = chromium_dom(pages / link, tmp_path / "profile")
    assert console == []
    check = image_check(dom)
    assert check["bad"] == [] and check["images"] == 4
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom and "&lt;b&gt;a shape&lt;/b&gt; &amp; 'more'" in dom
