"""Each rule written once (issue #41): the warehouse's rule views are the dbt models' SQL rendered over the
warehouse's relations (storage/sql_rules.py). Every rule renders with ``ref`` alone and runs on a warehouse, the
views have the marts' columns, and no rule's SQL is left in Python. Whether the rules give the right numbers is
checked against hand computations (tests/test_suites.py, test_group_metrics.py, test_fairface.py) and DataComp's own
rule (test_fairface.py), and the marts dbt builds from the same files against the evaluation's NumPy metric rows
(test_group_marts.py, test_suite_reports.py)."""

from __future__ import annotations

import re

import pytest

from clipcache import connect
from clipcache.storage import sql_rules
from clipcache.tasks.suites.sql import register

from conftest import REPO


def test_every_rule_renders_with_ref_alone_and_every_ref_resolves():
    for model in sql_rules.RULES:
        sql = sql_rules.render(model)
        assert "{{" not in sql and "ref(" not in sql, model
        text = sql_rules.model_file(model).read_text(encoding="utf-8")
        refs = set(re.findall(r"ref\('([a-z_0-9]+)'\)", text))
        assert refs and refs <= set(sql_rules.RELATIONS), (model, refs - set(sql_rules.RELATIONS))
        # nothing of dbt's Jinja but ref: a macro or source() would not render here
        assert not re.findall(r"\{\{(?!\s*ref\(')", text), model


def test_a_rule_using_more_of_dbt_is_refused_loudly(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "bad.sql").write_text("select * from {{ source('warehouse', 'metrics') }}\n")
    monkeypatch.setattr(sql_rules, "PROJECT_DIR", tmp_path)
    sql_rules._environment.cache_clear()
    sql_rules.model_file.cache_clear()
    try:
        with pytest.raises(Exception, match="source"):
            sql_rules.render("bad")
        with pytest.raises(LookupError, match="missing"):
            sql_rules.render("missing")
    finally:
        sql_rules._environment.cache_clear()
        sql_rules.model_file.cache_clear()


def test_every_rule_view_runs_on_an_empty_warehouse_with_the_marts_columns(tmp_path):
    con = connect(str(tmp_path / "out"))
    register(con)
    for model in sql_rules.RULES:
        view = sql_rules.RELATIONS[model]
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,), view
    described = {r[0] for r in con.execute("DESCRIBE suite_scores").fetchall()}
    assert {"score", "normalized", "partial_score", "coverage", "missing", "model_label"} <= described
    described = {r[0] for r in con.execute("DESCRIBE group_metrics").fetchall()}
    assert {"experiment_id", "model", "metric", "value", "groups"} <= described


def test_no_rule_sql_is_left_in_python():
    """The views' SQL lives in the dbt models only: no Python source creates a rule's view by hand."""
    views = {sql_rules.RELATIONS[m] for m in sql_rules.RULES}
    pattern = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+)?VIEW\s+(\w+)", re.IGNORECASE)
    for top in ("storage", "tasks", "flows"):
        for path in (REPO / top).rglob("*.py"):
            created = set(pattern.findall(path.read_text(encoding="utf-8")))
            assert not created & views, (path, created & views)
