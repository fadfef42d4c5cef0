"""Which experiments a user's words name, for ``compare``, ``report --compare`` and ``--model`` filters: every way
``eval`` takes a model names it here too.

In order: an experiment id or a unique prefix of one; a model as results name it (``tiny-shapes-clip``,
``perturbed``), ``model@checkpoint-label`` or a checkpoint identity (``sha256:...``); and otherwise the model as it
was given to ``eval``: a ``local-dir:``/``hf-hub:``/``api:`` spec, a local folder, a checkpoint file given as
``--pretrained`` (alone, or ``model@file``), resolved to its identity the way ``eval`` resolves it (file contents are
hashed, nothing is loaded). A name that fits several models is refused with the candidates in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clipcache.storage.errors import ClipcacheError, ConfigError


def select(found: list[dict[str, Any]], selector: str) -> list[dict[str, Any]]:
    """The experiments (rows with experiment_id, model, pretrained, checkpoint) ``selector`` names; [] if none."""
    by_id = [e for e in found if e["experiment_id"].startswith(selector)]
    if len({e["experiment_id"] for e in by_id}) == 1:
        return by_id[:1]
    model, _, label = selector.partition("@")
    named = [e for e in found if (e["model"] == model and (not label or e["pretrained"] == label))
             or e["checkpoint"] == selector]
    if not named:
        named = _as_given(found, selector)
    if not named and len({e["experiment_id"] for e in by_id}) > 1:
        ids = sorted({e["experiment_id"] for e in by_id})
        raise ConfigError(f"{selector!r} is the start of {len(ids)} experiment ids: {', '.join(ids[:8])}"
                          f"{' ...' if len(ids) > 8 else ''}; give more of one")
    models = sorted({(e["model"], e["pretrained"] or "", e["checkpoint"]) for e in named})
    if len(models) > 1:
        shown = "; ".join(f"{m}@{p}" if p else m for m, p, _ in models)
        raise ConfigError(f"{selector!r} names {len(models)} models: {shown} (give one as model@checkpoint, or an "
                          f"experiment id)")
    return named


def keep_models(rows: list[dict[str, Any]], selectors: list[str] | None, *,
                option: str = "--model") -> list[dict[str, Any]]:
    """The rows (with experiment_id, model, pretrained, checkpoint) of the models ``selectors`` name, each as
    :func:`select` takes it (or as ``model/pretrained``, the form these filters took first); every row of a named
    model is kept, not just the named experiment. A name that fits no model here, or several, is refused in one
    line; no selectors keep every row."""
    if not selectors:
        return rows
    found = list({e["experiment_id"]: e for e in rows}.values())
    keys: set[tuple[Any, ...]] = set()
    for selector in selectors:
        named = select(found, selector) or [e for e in found if f"{e['model']}/{e['pretrained']}" == selector]
        if not named:
            shown = sorted({e["model"] for e in found})
            raise ConfigError(f"{option} {selector!r} names no model with results here (models: "
                              f"{', '.join(shown[:8]) or 'none'}{' ...' if len(shown) > 8 else ''})")
        keys |= {_model_key(e) for e in named}
    return [row for row in rows if _model_key(row) in keys]


def _model_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["model"], row["pretrained"], row["checkpoint"]


def _as_given(found: list[dict[str, Any]], selector: str) -> list[dict[str, Any]]:
    """The experiments of the model ``selector`` names as ``eval`` was given it (a spec, a folder, a file)."""
    identities = [identity for identity in _resolved(selector) if identity is not None]
    out = []
    for checkpoint, model in identities:
        # a content identity (a file's or a folder's hash) names the weights alone; a tag or random weights need
        # the model's name too
        by_content = checkpoint.startswith("sha256:")
        out += [e for e in found if e["checkpoint"] == checkpoint and (by_content or e["model"] == model)]
    return list({e["experiment_id"]: e for e in out}.values())


def _resolved(selector: str) -> list[tuple[str, str] | None]:
    """(checkpoint identity, model name in results) of what ``selector`` would be to ``eval``: as --model, as
    ``model@pretrained``, or as a --pretrained file alone."""
    candidates: list[tuple[str, str | None]] = [(selector, None)]
    model, sep, pretrained = selector.rpartition("@")
    if sep and model and pretrained:
        candidates.append((model, pretrained))
    out: list[tuple[str, str] | None] = [_identity(name, pretrained) for name, pretrained in candidates]
    # a checkpoint file is its content whether or not this process knows the architecture (one eval registered
    # with --arch_config is unknown to a later compare)
    for file in (selector, pretrained if sep and model else None):
        path = Path(file).expanduser() if file else None
        if path is not None and path.is_file():
            from clipcache.storage.hashing import FileHashMemo
            from clipcache.tasks.models.loader import file_checkpoint

            out.append((file_checkpoint(path, FileHashMemo(None))[0], ""))
    return out


def _identity(model_name: str, pretrained: str | None) -> tuple[str, str] | None:
    try:
        from pydantic import ValidationError

        from clipcache.storage.hashing import FileHashMemo
        from clipcache.tasks.models.resolve import loader_for
        from clipcache.tasks.models.spec import ModelSpec

        spec = ModelSpec(model_name=model_name, pretrained=pretrained)
        resolved = loader_for(spec).resolve(spec, FileHashMemo(None), None)
    except (ClipcacheError, ValidationError, OSError, ValueError):
        return None  # not a model eval would take: no experiment of it
    return resolved.checkpoint, spec.display_name
