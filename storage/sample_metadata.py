"""Per-sample metadata of a dataset (WILDS locations and regions, Dollar Street income groups, GeoDE regions): a
warehouse table written once per dataset identity, which any model's sample rows join.

Layout under the output directory::

    warehouse/sample_metadata/<dataset_id>.parquet   one row per (sample, field)

``dataset_id`` is a content hash of the dataset name, split, layout, the samples' keys and every field's values, so
the file is written by the first run over that data and found by every later one (a file already there is left as
it is: its name is its content). Rows are long-format: ``field`` (``region``, ``income_ds``, ...), ``code`` (the
integer the dataset stores, DataComp's and WILDS' group index) and ``label`` (the code's name where the layout has
one: ``Asia``, ``2016``; null otherwise).

An experiment's sample rows name the metadata they were scored with in one row of unit ``metadata``
(``storage.experiment.LINK_UNIT``; ``sample_key`` = ``dataset_id``, written with the run's other sample rows and
committed by its run row), so a model evaluated later on the same data joins the same metadata, and data that
changed never joins the old one.
The view ``sample_metadata`` (registered by :func:`register_view`, called by ``open_warehouse``) reads the files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from clipcache.storage.atomic import atomic_write
from clipcache.storage.errors import ResultsError
from clipcache.storage.paths import AnyPath, url

if TYPE_CHECKING:  # DuckDB is imported where a view is registered: the dataset readers that import this need none
    import duckdb

TABLE = "sample_metadata"
SCHEMA_VERSION = 1
METADATA_SCHEMA = pa.schema([
    ("dataset_id", pa.string()),
    ("dataset", pa.string()),
    ("split", pa.string()),
    ("layout", pa.string()),  # where the metadata was read from: datacomp_wds, wilds_csv
    ("sample_index", pa.int64()),  # position in the dataset's order, as in the samples table
    ("sample_key", pa.string()),  # the sample's own name, as in the samples table
    ("field", pa.string()),
    ("code", pa.int64()),
    ("label", pa.string()),
    ("schema_version", pa.int32()),
])


@dataclass(frozen=True)
class SampleMetadata:
    """Metadata of the samples of one dataset split, in the dataset's order."""

    dataset: str
    split: str
    layout: str
    keys: list[str]  # each sample's own name (its ``sample_key``)
    codes: dict[str, np.ndarray]  # field -> (n,) int64
    labels: dict[str, dict[int, str]] = field(default_factory=dict)  # field -> code -> name, where known

    def __post_init__(self) -> None:
        for name, values in self.codes.items():
            if len(values) != len(self.keys):
                raise ValueError(f"metadata field {name!r} has {len(values)} values for {len(self.keys)} samples")

    @cached_property
    def dataset_id(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([self.dataset, self.split, self.layout, sorted(self.codes),
                             {f: {str(c): n for c, n in sorted(m.items())} for f, m in sorted(self.labels.items())}],
                            sort_keys=True).encode())
        h.update("\n".join(self.keys).encode())
        for name in sorted(self.codes):
            h.update(np.ascontiguousarray(self.codes[name], dtype="<i8").tobytes())
        return h.hexdigest()[:16]

    def table(self) -> pa.Table:
        n, fields = len(self.keys), sorted(self.codes)
        index = np.arange(n, dtype=np.int64)
        labels = [self.labels.get(f, {}) for f in fields]
        codes = [np.asarray(self.codes[f], dtype=np.int64) for f in fields]
        columns: dict[str, Any] = {
            "dataset_id": [self.dataset_id] * (n * len(fields)),
            "dataset": [self.dataset] * (n * len(fields)),
            "split": [self.split] * (n * len(fields)),
            "layout": [self.layout] * (n * len(fields)),
            "sample_index": np.tile(index, len(fields)),
            "sample_key": self.keys * len(fields),
            "field": [f for f in fields for _ in range(n)],
            "code": np.concatenate(codes) if codes else np.zeros(0, np.int64),
            "label": [names.get(int(c)) for names, values in zip(labels, codes, strict=True) for c in values],
            "schema_version": np.full(n * len(fields), SCHEMA_VERSION, dtype=np.int32),
        }
        return pa.Table.from_pydict(columns, schema=METADATA_SCHEMA)


def metadata_dir(warehouse: AnyPath) -> AnyPath:
    return warehouse / TABLE


def write_sample_metadata(warehouse: AnyPath, metadata: SampleMetadata) -> AnyPath | None:
    """Write ``metadata`` under ``warehouse`` unless a file of the same identity is there; the path written, or
    None when it was already there."""
    path = metadata_dir(warehouse) / f"{metadata.dataset_id}.parquet"
    if path.exists():
        return None
    table = metadata.table()
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path


def _empty_view(con: duckdb.DuckDBPyConnection) -> None:
    con.register(f"_{TABLE}_empty", METADATA_SCHEMA.empty_table())
    con.execute(f"CREATE OR REPLACE VIEW {TABLE} AS SELECT * FROM _{TABLE}_empty")


def register_view(con: duckdb.DuckDBPyConnection, warehouse: AnyPath) -> None:
    """``CREATE VIEW sample_metadata`` over the metadata files under ``warehouse`` (typed and empty without any)."""
    import duckdb

    folder = metadata_dir(warehouse)
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    if not files:
        _empty_view(con)
        return
    listed = ", ".join("'" + url(f).replace("'", "''") + "'" for f in files)
    columns = ", ".join(f.name for f in METADATA_SCHEMA)
    try:
        con.execute(f"CREATE OR REPLACE VIEW {TABLE} AS SELECT {columns} FROM read_parquet([{listed}], "
                    f"union_by_name = true)")
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0]
        raise ResultsError(f"cannot read the {TABLE} files under {folder} ({first}); move the damaged file away "
                           f"(it is rewritten by the next run over its dataset)") from e
