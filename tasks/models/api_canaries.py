"""Drift check of API models: fixed canary inputs, embedded whenever the model is loaded, compared with the first
answers recorded for the same identity (model id, declared revision, request format).

A provider can change the model behind a name without notice; cached vectors of the old model would then be mixed
with new ones in one experiment. So before an API model embeds its first text it embeds two short canary texts, and
before its first image one small generated image: a run that needs no image never sends one (a text-only model is
never asked for an image). The first run of an identity records each modality's vectors in
``<cache>/api_canaries/<fingerprint>.json`` (written atomically; a modality seen later is added), later runs compare
(cosine >= 0.9999, same dimension) and stop with one line when they differ. A run whose embeddings are all cached
never loads the model, so it sends nothing and checks nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from clipcache.storage.atomic import atomic_write_json
from clipcache.storage.errors import CacheIntegrityError, ModelError
from clipcache.tasks.models.api_spec import today_revision

CANARY_TEXTS = ("a photo of a red circle on a white background.",
                "clipcache canary: the quick brown fox jumps over the lazy dog.")
MIN_COSINE = 0.9999  # fp32 noise between two runs of one model is far above this; another model far below


def canary_image() -> Image.Image:
    """A 64x64 gradient with a blue square and a red disc: the same pixels on every machine."""
    ramp = np.linspace(0, 255, 64, dtype=np.float32)
    pixels = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (64, 1)), np.tile(ramp[:, None], (1, 64))], -1)
    image = Image.fromarray(pixels.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    draw.rectangle((8, 8, 27, 27), fill=(30, 60, 220))
    draw.ellipse((34, 30, 57, 53), fill=(220, 40, 40))
    return image


def canary_names(modality: str) -> list[str]:
    if modality == "image":
        return ["the generated image"]
    return [f"text {i + 1} ({text!r})" for i, text in enumerate(CANARY_TEXTS)]


def _recorded(path: Path, label: str) -> dict[str, Any]:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        if "vectors" in recorded and "text_vectors" not in recorded:  # written before modalities were apart
            rows = recorded.pop("vectors")
            recorded["text_vectors"], recorded["image_vectors"] = rows[:len(CANARY_TEXTS)], rows[len(CANARY_TEXTS):]
        for modality in ("text", "image"):
            if f"{modality}_vectors" in recorded:
                np.asarray(recorded[f"{modality}_vectors"], dtype=np.float32)
        return dict(recorded)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CacheIntegrityError(f"{label}: the recorded canary file {path} cannot be read ({type(e).__name__}); "
                                  f"delete it to record the canaries again") from e


def check_canaries(vectors: np.ndarray, path: Path | None, identity: dict[str, Any], label: str,
                   revision: str, modality: str = "text") -> None:
    """Record ``vectors`` (one modality's canary answers, L2-normalised, in canary order) for this identity, or
    compare them with the recorded ones; a ModelError naming the model, the revision and the fix when they differ."""
    if path is None:  # no cache folder to keep them in (a model used outside a run): nothing to compare with
        return
    recorded = _recorded(path, label) if path.exists() else {
        "identity": identity, "texts": list(CANARY_TEXTS), "dim": int(vectors.shape[1])}
    key = f"{modality}_vectors"
    if key not in recorded:
        recorded[key] = vectors.astype(np.float32).tolist()
        recorded[f"{modality}_recorded_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        recorded.setdefault("recorded_at", recorded[f"{modality}_recorded_at"])
        atomic_write_json(path, recorded)
        return
    before = np.asarray(recorded[key], dtype=np.float32)
    when = str(recorded.get(f"{modality}_recorded_at", recorded.get("recorded_at", "an earlier run")))
    if before.shape != vectors.shape:
        raise _drift(label, revision, path, when, f"it answers {vectors.shape[1]}-dimensional vectors, "
                                                 f"{before.shape[-1] if before.ndim == 2 else '?'} then")
    cosines = (before * vectors).sum(axis=1) / (np.linalg.norm(before, axis=1) * np.linalg.norm(vectors, axis=1))
    worst = int(np.argmin(cosines))
    if cosines[worst] < MIN_COSINE:
        raise _drift(label, revision, path, when, f"canary {canary_names(modality)[worst]} has cosine "
                                                 f"{cosines[worst]:.6f} to its vector then (< {MIN_COSINE})")


def _drift(label: str, revision: str, path: Path, when: str, what: str) -> ModelError:
    today = today_revision()
    new = today if today != revision else f"{revision}-2"
    return ModelError(f"{label} at revision {revision!r} no longer answers as it did on {when}: {what}. The model "
                      f"behind the API has changed; nothing was embedded. Pass a new --api_revision (e.g. "
                      f"--api_revision {new}) so its vectors are cached apart from the old ones (canaries: {path})")
