"""Rules written once: the SQL that both the warehouse's views and the dbt project run.

Each rule (the leaderboard's choice of run, the latest sample rows of an experiment, a suite score, a group metric,
a face-attribute outcome) is one model of the dbt project, ``dbt_reports/models/**/<model>.sql``: a SELECT whose
inputs are named with dbt's ``{{ ref('model') }}`` and nothing else of dbt. dbt builds it as a model over its staging
models; a DuckDB connection over the warehouse renders the very same file with every ``ref`` replaced by the view or
table that holds those rows here (:data:`RELATIONS`: ``stg_metrics`` is the ``metrics`` view, ``latest_metrics`` the
``leaderboard`` view, ``stg_latest_samples`` the ``latest_samples`` view...) and creates a view of it under the
rule's warehouse name. So a rule changes in one file, and the marts and the views cannot disagree
(tests/test_sql_rules.py checks that every rule renders and runs here, and the marts and views are checked against
hand-computed numbers).

The files ship inside the package (``clipcache/dbt_reports``, the repository's dbt_reports/ folder); rendering only
reads them. A rule file may use ``ref`` only: anything else of dbt's Jinja is an error here (StrictUndefined), which
the tests turn into a failure the moment a rule uses it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

# clipcache/storage/ -> clipcache/dbt_reports in an installed package; resolved, the repository's dbt_reports/
PROJECT_DIR = Path(__file__).resolve().parents[1] / "dbt_reports"

# dbt model -> the relation on a warehouse connection that holds the same rows: first the inputs (views of
# storage/warehouse.py, tables tasks/suites/ registers: dbt reads them through its own staging models), then the
# rules, each a view rendered from its model
INPUTS = ("stg_metrics", "stg_samples", "stg_sample_metadata", "stg_suite_datasets", "stg_group_definitions",
          "stg_face_definitions")
RELATIONS = {
    "stg_metrics": "metrics",
    "stg_samples": "samples",
    "stg_sample_metadata": "sample_metadata",
    "stg_suite_datasets": "suite_datasets",
    "stg_group_definitions": "group_definitions",
    "stg_face_definitions": "face_definitions",
    "latest_metrics": "leaderboard",
    "stg_latest_samples": "latest_samples",
    "stg_experiment_models": "experiment_models",
    "stg_experiment_metadata": "experiment_metadata",
    "stg_sample_groups": "sample_groups",
    "stg_face_outcomes": "face_outcomes",
    "face_group_metrics": "face_group_metrics",
    "face_metrics": "face_metrics",
    "group_accuracy": "group_accuracy",
    "group_metrics": "group_metrics",
    "suite_results": "suite_results",
    "suite_scores": "suite_scores",
}
RULES = tuple(model for model in RELATIONS if model not in INPUTS)


@cache
def _environment() -> jinja2.Environment:
    # SQL, not HTML: nothing to escape; StrictUndefined: a rule using more of dbt than ref() fails loudly
    return jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_DIR / "models"), autoescape=False,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@cache
def model_file(model: str) -> Path:
    """The dbt model file of ``model`` (its name is unique in a dbt project)."""
    found = sorted((PROJECT_DIR / "models").rglob(f"{model}.sql"))
    if len(found) != 1:
        raise LookupError(f"dbt model {model!r}: {len(found)} files under {PROJECT_DIR / 'models'}")
    return found[0]


def render(model: str, relations: dict[str, str] | None = None) -> str:
    """The SELECT of dbt model ``model`` with each ``ref`` replaced by its warehouse relation (``relations`` may
    name others: a query over one suite's datasets, say)."""
    names = {**RELATIONS, **(relations or {})}

    def ref(name: str) -> str:
        if name not in names:
            raise LookupError(f"dbt model {model!r} refers to {name!r}, which has no warehouse relation")
        return names[name]

    template = _environment().get_template(model_file(model).relative_to(PROJECT_DIR / "models").as_posix())
    return template.render(ref=ref).strip().rstrip(";")


def create_view(con: DuckDBPyConnection, model: str, *, columns: tuple[str, ...] | None = None) -> None:
    """Create (or replace) the warehouse view of rule ``model`` on ``con`` (``columns``: only these, in order)."""
    select = render(model)
    if columns is not None:
        select = f"SELECT {', '.join(columns)} FROM (\n{select}\n)"
    con.execute(f"CREATE OR REPLACE VIEW {RELATIONS[model]} AS\n{select}")
