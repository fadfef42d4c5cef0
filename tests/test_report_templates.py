"""The report and compare pages from Jinja2 templates with autoescaping (issue #41): names that look like markup are
text on every page, the templates ship with the package, and the pages keep their markup (the browser tests,
tests/test_report_compare.py, test_warehouse.py and test_suite_reports.py, read the rendered pages)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import duckdb

from clipcache.tasks.report import flip_pages
from clipcache.tasks.report.flips import Flip, UnitFlips
from clipcache.tasks.report.html import render_report
from clipcache.tasks.report.pages import TEMPLATES, environment
from clipcache.tasks.report.sample_media import DatasetView

HOSTILE = "<script>alert(1)</script>&'\""
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&#39;&#34;"
VOID = {"meta", "img", "br", "line", "rect", "circle", "polyline"}


class Balance(HTMLParser):
    """Every element closed in order (SVG's self-closed shapes and HTML's void elements aside), no script."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.scripts += tag == "script"

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-3:])
        self.stack.pop()


def assert_text_only(page: str) -> None:
    checker = Balance()
    checker.feed(page)
    assert checker.stack == [] and checker.scripts == 0
    assert "<script>" not in page and ESCAPED in page


def hostile_marts(database) -> None:
    h = HOSTILE.replace("'", "''")
    con = duckdb.connect(str(database))
    con.execute(f"CREATE TABLE model_summary AS SELECT '{h}' AS model, '{h}' AS pretrained, "
                f"'zeroshot_classification' AS task, 1 AS n_datasets, 0.9::DOUBLE AS macro_average, now() AS newest_result")
    con.execute(f"CREATE TABLE leaderboard AS SELECT * FROM (VALUES ('{h}', '{h}', 'zeroshot_classification', 'acc1', "
                f"0.9::DOUBLE, 100, '{h}', now(), 0.84::DOUBLE, 0.95::DOUBLE)) t(model_label, dataset_label, task, "
                f"main_metric, main_value, n_samples, run_id, created_at, ci_low, ci_high)")
    con.execute(f"CREATE TABLE retrieval_curves AS SELECT * FROM (VALUES ('{h}', '{h}', 'image', 1, 0.3::DOUBLE), "
                f"('{h}', '{h}', 'image', 5, 0.7)) t(model_label, dataset_label, direction, k, value)")
    con.execute(f"CREATE TABLE metric_history AS SELECT now() AS created_at, '{h}' AS model, NULL AS pretrained, "
                f"'{h}' AS dataset, 'acc' AS metric, 1 AS k, 0.8::DOUBLE AS previous_value, 0.7::DOUBLE AS value, "
                f"-0.1::DOUBLE AS delta, true AS regressed, false AS improved")
    con.execute(f"CREATE TABLE suite_scores AS SELECT * FROM (VALUES ('{h}', '{h}', NULL::VARCHAR, NULL::VARCHAR, "
                f"'fp32', '{h}', false, 1, 3, NULL::DOUBLE, NULL::DOUBLE, 0.3::DOUBLE, ['{h}'])) t(suite, model, "
                f"pretrained, checkpoint, precision, model_label, complete, datasets_present, datasets, score, "
                f"normalized, partial_score, missing)")
    con.execute("CREATE TABLE suite_intervals AS SELECT NULL::VARCHAR AS suite, NULL::VARCHAR AS model, "
                "NULL::VARCHAR AS pretrained, NULL::VARCHAR AS checkpoint, NULL::VARCHAR AS precision, "
                "NULL::INTEGER AS rank, NULL::DOUBLE AS score_ci_low, NULL::DOUBLE AS score_ci_high, "
                "NULL::DOUBLE AS normalized_ci_low, NULL::DOUBLE AS normalized_ci_high, "
                "NULL::VARCHAR[] AS not_separable_from, NULL::VARCHAR AS no_interval_because WHERE false")
    con.close()


def test_the_report_shows_markup_in_names_as_text(tmp_path):
    hostile_marts(tmp_path / "reports.duckdb")
    page = render_report(tmp_path / "reports.duckdb", tmp_path / "index.html").read_text()
    assert_text_only(page)
    # every table, chart and section the page has, each naming the hostile model or dataset as text
    for part in ("<table><thead>", 'id="suites"', "aria-label=\"model by dataset heatmap\"", "<polyline",
                 'class="regressed"', 'aria-label="95% interval 0.8400 to 0.9500"', "partial: 1 of 3"):
        assert part in page, part
    assert page.count(ESCAPED) >= 10


def test_the_compare_pages_show_markup_in_names_captions_and_paths_as_text():
    flips = [Flip(0, HOSTILE, 1, [1, 0], [0, 1], 2, 1), Flip(1, None, None, [2], [1], None, None)]
    units = [UnitFlips("image", 4, 2, 1, 2, 0, flips, []), UnitFlips("text_query", 4, 2, 1, 1, 1, flips[:1], flips),
             UnitFlips("image_query", 3, 1, 1, 1, 1, flips, flips[:1]), UnitFlips(HOSTILE, 2, 1, 0, 1, 0, flips)]
    side = {"model": HOSTILE, "pretrained": HOSTILE, "sample_limit": None, "dataset": HOSTILE, "split": "test",
            "language": "en", "precision": "fp32", "task": HOSTILE, "experiment_id": HOSTILE}
    view = DatasetView(None, [HOSTILE, "b", "c"], [HOSTILE, "second"], [0, 1], HOSTILE)
    page = flip_pages.PairPage("00-x.html", side, side, units, view, {0: f"thumbs/{HOSTILE}.jpg", 1: "thumbs/1.jpg"})
    pair = flip_pages.render_pair_page(page, HOSTILE, "B")
    assert_text_only(pair)
    assert len(re.findall(r"<section class='unit'", pair)) == 4 and pair.count("<li class='hit'>") >= 3
    assert "<img class='thumb hit' src='thumbs/1.jpg'" in pair and "<span class='noimg' title='image 2'>#2</span>" in pair
    index = flip_pages.render_index([page], [(side, side)], HOSTILE, "B")
    assert_text_only(index)
    assert "id='00-x-image-a-only'>2<" in index


def test_the_captioning_compare_page_shows_each_image_with_both_captions():
    """Hand-made rows (tests/test_report_compare.py builds them from two captioning runs): each image's two captions,
    its references and the scores, as text; the index links the page with its images and means."""
    side = {"model": HOSTILE, "pretrained": None, "sample_limit": None, "dataset": "flickr8k", "split": "test",
            "language": "en", "precision": "fp32", "task": "captioning", "experiment_id": "e1"}
    rows = [flip_pages.CaptionRow(0, HOSTILE, "a red circle", {"cider": 0.5}, {"cider": 1.25}, [HOSTILE, "red"]),
            flip_pages.CaptionRow(1, "a blue square", None, {}, {"cider": 0.0})]
    page = flip_pages.CaptionPage("00-flickr8k.html", side, {**side, "model": "b", "experiment_id": "e2"}, rows,
                                  ["cider"], DatasetView(), {0: "thumbs/0.jpg"}, n_images=7, means=(0.25, 0.5))
    html = flip_pages.render_caption_page(page, "a", "b")
    assert_text_only(html)
    body = re.findall(r"<tr><td>(<img[^>]*>|<span class='noimg'[^<]*</span>)</td><td>([^<]*)</td><td>([^<]*)</td>"
                      r"<td><ul class='refs'>(.*?)</ul></td><td class='num'>([^<]*)</td><td class='num'>([^<]*)</td>"
                      r"</tr>", html)
    assert body == [("<img class='thumb' src='thumbs/0.jpg' alt='image 0' title='image 0'>", ESCAPED,
                     "a red circle", f"<li>{ESCAPED}</li><li>red</li>", "0.5000", "1.2500"),
                    ("<span class='noimg' title='image 1'>#1</span>", "a blue square", "", "", "–", "0.0000")]
    assert "the 2 of 7 images whose cider differs most between A and B" in html
    index = flip_pages.render_index([], [], HOSTILE, "b", captions=[page])
    assert_text_only(index)
    assert ("<td><a href='00-flickr8k.html'>flickr8k</a></td><td>captioning</td><td>captions</td>"
            "<td class='num'>7</td>") in index and "mean cider: A 0.2500, B 0.5000" in index


def test_templates_autoescape_and_ship_with_the_package():
    env = environment()
    assert env.autoescape is True
    names = set(env.list_templates())
    assert {"report.html.j2", "compare_pair.html.j2", "compare_index.html.j2", "report.css"} <= names
    for name in names:  # nothing printed unescaped but the one literal fallback paragraph
        source = (TEMPLATES / name).read_text(encoding="utf-8")
        assert source.count("|safe") <= (1 if name == "report.html.j2" else 0), name
