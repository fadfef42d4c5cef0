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
