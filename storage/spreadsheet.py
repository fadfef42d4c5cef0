"""CSV that a spreadsheet opens as data: no cell of ours runs as a formula.

Excel, LibreOffice and Google Sheets evaluate a cell that starts with ``=``, ``+``, ``-`` or ``@`` (and, after their
own trimming, a tab or carriage return followed by one) as a formula, so a model or dataset name such as
``=HYPERLINK("http://...")`` in an exported table would become a live link or worse. As the OWASP guidance on CSV
injection says, such a text cell is written with a leading single quote, which the spreadsheet shows as text and
hides; numbers are left alone (``-0.5`` stays a number). Every CSV clipcache writes goes through :func:`csv_writer`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from typing import Any, TextIO

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def formula_safe(value: object) -> object:
    """``value`` itself unless it is text a spreadsheet would evaluate; then ``'`` + the text."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        if math.isfinite(float(value)) and value.strip() == value:
            return value  # a plain number such as -0.5 or +1e-3
    except ValueError:
        pass
    return "'" + value


class _FormulaSafeWriter:
    def __init__(self, stream: TextIO, lineterminator: str):
        self._writer = csv.writer(stream, lineterminator=lineterminator)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([formula_safe(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def csv_writer(stream: TextIO, *, lineterminator: str = "\r\n") -> _FormulaSafeWriter:
    """``csv.writer(stream, lineterminator=...)`` (csv's default ends rows with CRLF) whose text cells are made
    :func:`formula_safe`."""
    return _FormulaSafeWriter(stream, lineterminator)
