"""List cells of CSV files, read as data: a bracketed list of quoted names as Python writes one (``['a', "b's"]``,
``[]``) and nothing else. Both CREPE's hard negatives and Dollar Street's topics are stored this way; neither is
ever evaluated (no ``eval``, no ``ast.literal_eval``, whose parser a hostile cell can exhaust)."""

from __future__ import annotations

import re

_ITEM = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""
_LIST = re.compile(rf"\[\s*(?:(?:{_ITEM})\s*(?:,\s*(?:{_ITEM})\s*)*,?\s*)?\]")
_QUOTED = re.compile(_ITEM)
_ESCAPES = {"\\": "\\", "'": "'", '"': '"'}


def quoted_list(cell: str) -> list[str] | None:
    """The names of a list cell, or None when the cell is anything else (an escape other than ``\\\\``, ``\\'`` or
    ``\\"`` included)."""
    text = cell.strip()
    if not _LIST.fullmatch(text):
        return None
    names = []
    for item in _QUOTED.findall(text):
        body, out, i = item[1:-1], [], 0
        while i < len(body):
            if body[i] == "\\":
                if body[i + 1] not in _ESCAPES:
                    return None
                out.append(_ESCAPES[body[i + 1]])
                i += 2
            else:
                out.append(body[i])
                i += 1
        names.append("".join(out))
    return names
