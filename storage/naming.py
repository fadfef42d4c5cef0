"""Names that become paths, and format strings that users write.

Every file or folder name built from a name the user or a dataset gave (a model, a dataset, a language, a captioning
model) goes through :func:`path_component`, which keeps it inside its folder by construction: the result is one path
component, never ``.`` or ``..``, never hidden, without separators, NUL or control characters, and at most
:data:`MAX_COMPONENT` characters. Where cleaning changes the name, a short hash of the raw name is appended, so two
names that clean to the same text (``foo bar`` and ``foo_bar``, ``orgA/describer`` and ``orgB/describer``) never
share a file or folder.

Format strings (class-name templates with ``{c}``, clip_benchmark's ``--output`` pattern) may hold only plain
``{name}`` fields from a known set: :func:`template_problem` says why one does not, before any work starts. Python's
``str.format`` would otherwise follow attributes and indexes (``{model.upper}`` names a file after a bound method).
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Collection

_UNSAFE = re.compile(r"[^\w.@+=-]+")
MAX_COMPONENT = 100


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def clean(text: str) -> str:
    """``text`` with every run of characters outside ``[\\w.@+=-]`` replaced by ``_``, and no leading dots."""
    return _UNSAFE.sub("_", text).strip("_").lstrip(".")


def path_component(text: str, *, identity: str | None = None) -> str:
    """A file or folder name for ``text`` that stays inside its folder and tells ``identity`` (default: ``text``)
    apart from every other: ``text`` itself when it is already a safe name and is the identity, else the cleaned
    text (truncated) plus ``-`` and 8 hex digits of the identity's SHA-256."""
    identity = text if identity is None else identity
    cleaned = clean(text)
    if cleaned == text == identity and 0 < len(text) <= MAX_COMPONENT:
        return text
    return f"{cleaned[:MAX_COMPONENT] or '_'}-{_short_hash(identity)}"


MAX_FILE_NAME = 200  # below the 255 bytes of common file systems, with room for a suffix and a temporary name


def bounded(name: str) -> str:
    """``name`` (already made of safe components), shortened with a hash of itself when it is too long for a file
    name."""
    if len(name.encode("utf-8")) <= MAX_FILE_NAME:
        return name
    return f"{name.encode('utf-8')[:MAX_FILE_NAME - 60].decode('utf-8', 'ignore')}-{_short_hash(name)}"


def template_problem(template: str, fields: Collection[str]) -> str | None:
    """Why ``template`` is not a format string of plain ``{name}`` fields drawn from ``fields``; None when it is."""
    known = ", ".join("{" + f + "}" for f in fields)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        return f"is not a valid template ({e}; write a literal brace as {{{{ or }}}})"
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field == "" or field.isdigit():
            return f"has a positional field {{{field}}}; only named fields are allowed ({known})"
        if not field.isidentifier():
            return (f"has the field {{{field}}}: only plain {{name}} fields are allowed, no attribute or index "
                    f"access ({known})")
        if field not in fields:
            return f"has an unknown field {{{field}}} (fields: {known})"
        if conversion or spec:
            return f"has {{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: only plain " \
                   f"{{name}} fields are allowed ({known})"
    return None
