"""The project's exception hierarchy.

Every error a user can cause derives from :class:`ClipcacheError`; the CLI turns these into one line and a non-zero exit
code. Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations


class ClipcacheError(Exception):
    """Base class for errors caused by input, configuration or the environment (not by bugs)."""

    exit_code = 1


class ConfigError(ClipcacheError):
    """A configuration value is missing, unknown or malformed."""

    exit_code = 2


class DatasetError(ClipcacheError):
    """A dataset cannot be found, read or decoded, or does not fit the requested task."""


class ModelError(ClipcacheError):
    """A model name resolves to nothing, or its weights cannot be loaded."""


class CacheIntegrityError(ClipcacheError):
    """A cache entry on disk does not match the key it was read with, or its data is damaged."""


class ResultsError(ClipcacheError):
    """Results cannot be written or read."""


class VLMRequestError(ClipcacheError):
    """A request to a multimodal LLM failed (fatal status, or transient errors after every retry)."""


def parse_problem(error: Exception) -> str:
    """Where and what, in one line, for a JSON or YAML parse error: ``line 2, column 7: expected ',' or ']'``
    (PyYAML's own message spans several lines with the offending text and a caret)."""
    mark = getattr(error, "problem_mark", None)
    if mark is not None:  # yaml.MarkedYAMLError
        return f"line {mark.line + 1}, column {mark.column + 1}: {getattr(error, 'problem', None) or 'cannot parse'}"
    if hasattr(error, "lineno") and hasattr(error, "msg"):  # json.JSONDecodeError
        return f"line {error.lineno}, column {getattr(error, 'colno', 0)}: {error.msg}"
    return " ".join(str(error).split())
