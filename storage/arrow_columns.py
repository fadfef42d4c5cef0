"""NumPy arrays as Arrow columns without copies or pandas: the sample rows' writer builds its table from these.

pyarrow's converters (``pa.array``) import pandas, half a second of every CLI call; Arrow arrays over the arrays'
buffers do not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass(frozen=True)
class Ragged:
    """A list column whose rows differ in length (NumPy arrays): row i is ``values[offsets[i]:offsets[i + 1]]``."""

    offsets: np.ndarray  # int32, one more than the rows
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_mask(cls, mask: npt.ArrayLike, labels: npt.ArrayLike) -> Ragged:
        """Row i lists ``labels[j]`` for every j where ``mask[i, j]``, in order (e.g. the ks at which a query hits)."""
        import numpy as np

        mask = np.asarray(mask, dtype=bool)
        offsets = np.zeros(len(mask) + 1, dtype=np.int32)
        np.cumsum(mask.sum(axis=1), out=offsets[1:])
        return cls(offsets, np.broadcast_to(np.asarray(labels, dtype=np.int32), mask.shape)[mask])


def from_numpy(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """An Arrow array over a NumPy array's buffer. pyarrow's converters (pa.array) import pandas, half a second of
    every CLI call; buffers do not. A masked array's masked entries are nulls."""
    import numpy as np

    validity = None
    if isinstance(values, np.ma.MaskedArray):
        present = ~np.ma.getmaskarray(values)
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
        values = values.filled(0)
    if pa.types.is_boolean(type_):
        bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
        return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(bits)])
    dtype = {pa.int64(): np.int64, pa.int32(): np.int32, pa.float64(): np.float64}.get(type_, np.int64)
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(type_, len(data), [validity, pa.py_buffer(data)])


def list_array(values: npt.ArrayLike | Ragged) -> pa.Array:
    """A list<int32> column from a 2-D array (rows of one width) or a :class:`Ragged`."""
    import numpy as np

    if isinstance(values, Ragged):
        offsets, flat = np.asarray(values.offsets, dtype=np.int32), values.values
    else:
        grid = np.ascontiguousarray(values, dtype=np.int32)
        offsets, flat = np.arange(len(grid) + 1, dtype=np.int32) * grid.shape[1], grid.ravel()
    return pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), from_numpy(flat, pa.int32()))


def strings(texts: list[str]) -> pa.Array:
    import numpy as np

    encoded = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets),
                                                             pa.py_buffer(b"".join(encoded))])


def string_lists(rows: list[list[str]]) -> pa.Array:
    """A list<string> column, one list of texts per row (a captioned image's references)."""
    import numpy as np

    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), strings([t for r in rows for t in r]))
