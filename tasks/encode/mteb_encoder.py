"""clipcache models as mteb 2.x encoders: every image and text mteb asks for goes through the embedding cache.

mteb's evaluators call ``encode(dataloader, task_metadata=..., hf_split=..., hf_subset=..., prompt_type=...)`` with
batches of ``{"text": [str, ...]}`` and/or ``{"image": [PIL.Image, ...]}`` (RGB, decoded by ``datasets``), and expect
one row per input. :class:`CachedMtebEncoder` answers from content-addressed pools:

- texts: the model's text pool (``TextPool``, the one class prompts use: keyed by model identity, precision and each
  text's SHA-256), so "a photo of a cat." is one vector for every MIEB task and every zero-shot classification. A
  retrieval task's queries (mteb's ``prompt_type=PromptType.query``) are embedded as queries: the same vectors for a
  local model, which embeds every text alike; the query role or prefix for an ``api:`` model that sends one, whose
  queries then have a pool of their own (``ResolvedModel.text_roles``);
- images: the model's image pool (``ContentPool``, keyed by model identity, which holds the resolved preprocessing,
  precision and the SHA-256 of each image's decoded pixels, mode and size), so two MIEB tasks over the same images
  (CIFAR10ZeroShot and CIFAR10Clustering read one dataset) share every vector, whatever the task, split or order.

Only what a pool lacks is encoded, in mteb's own batches; a re-run encodes nothing and never loads the model.
Each pool batch keeps the model's raw float32 rows (and each row's norm) beside the L2-normalised rows, so mteb
receives the raw features bit for bit, fresh or cached: what mteb's CLIP, OpenCLIP and SigLIP wrappers hand its
evaluators (a probe's logistic regression can flip a prediction on a last-bit difference); an input of an image and a
text (composed queries, image+question) is the sum of the two raw vectors, as those wrappers sum their two features.
Batches of earlier releases keep norms only: their raw features are rebuilt as normalised row x norm (equal within
~1e-7 relative), and a warning says so (delete them with ``clipcache cache`` to re-encode once). Where a vector read
has no norm either (a model that cannot give them), that call's vectors are the normalised rows, and a warning says
which (cosine scores do not change; sums, k-means and distances do). Audio, video and conversation inputs are
refused in one line. :class:`UncachedMtebEncoder` is the same model without the cache (the parity reference and the
benchmark's "mteb's own run").
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from abc import abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction
from mteb.types import PromptType

from clipcache.storage.cache_keys import AuxSpec
from clipcache.storage.content_pool import DIGEST_ARRAY, ContentPool, digests_array
from clipcache.storage.errors import ConfigError, DatasetError
from clipcache.storage.hashing import digest
from clipcache.storage.text_pool import TextPool

if TYPE_CHECKING:
    from collections.abc import Iterable

    from PIL import Image

    from clipcache.storage.embedding_store import EmbeddingStore
    from clipcache.tasks.contract import EncodeSession
    from clipcache.tasks.models.base import EmbeddingModel
    from clipcache.tasks.progress import StageProgress

log = logging.getLogger("clipcache.mieb")

IMAGE_ROLE = "mieb_image"  # the image pool's role; its batches are "mieb_image-batch" entries
SUPPORTED = ("text", "image")
REFUSED = ("audio", "video", "conversation")


def image_sha256(image: Any) -> bytes:
    """The content digest of a decoded image: mode, size and pixels (two files that decode alike are one image)."""
    if not hasattr(image, "tobytes") or not hasattr(image, "mode"):
        raise ConfigError(f"mteb passed an image as {type(image).__name__}; clipcache's mteb encoder takes PIL images")
    h = hashlib.sha256(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    h.update(image.tobytes())
    return h.digest()


def input_columns(dataset: Any) -> set[str]:
    """The columns an mteb dataloader's dataset holds: ``column_names`` of a ``datasets.Dataset``, or the keys of
    ``features`` where that is all it has (the torch dataset of images mteb's image-text pair evaluator builds)."""
    names = getattr(dataset, "column_names", None)
    if names is None:
        names = list(getattr(dataset, "features", None) or ())
    return {str(name) for name in names}


def image_pool_fields(session: EncodeSession) -> dict[str, Any]:
    """The pool of a model's image vectors: everything but the content that changes a vector (the model identity
    holds the resolved preprocessing; images reach it decoded by ``datasets`` and PIL, never ``--decode gpu``)."""
    return {"role": IMAGE_ROLE, "model": session.resolved.image_identity, "precision": session.precision}


def model_meta(name: str, revision: str) -> ModelMeta:
    """What mteb records about the model: its name and revision, cosine similarity, images and texts."""
    return ModelMeta.create_empty(overwrites={"name": name, "revision": revision, "modalities": list(SUPPORTED),
                                              "similarity_fn_name": ScoringFunction.COSINE})


@dataclass
class EncodeCounts:
    """Inputs encoded by a forward pass, inputs served from the cache, and the cache entries read or written."""

    images_encoded: int = 0
    texts_encoded: int = 0
    images_cached: int = 0
    texts_cached: int = 0
    image_keys: list[str] = field(default_factory=list)
    text_keys: list[str] = field(default_factory=list)
    by_prompt_type: dict[str, int] = field(default_factory=dict)  # inputs mteb passed as "query", "document", "none"

    @property
    def encoded(self) -> int:
        return self.images_encoded + self.texts_encoded


def _add(keys: list[str], new: Iterable[str]) -> None:
    keys.extend(k for k in dict.fromkeys(new) if k not in keys)


# L2-normalised rows; the raw rows (None: unknown); whether those are the model's output bit for bit (False: rebuilt
# as row x norm from a batch of an earlier release)
Vectors = tuple[np.ndarray, "np.ndarray | None", bool]


class _MtebEncoder(AbsEncoder):
    """mteb's encoder protocol over two hooks, ``_image_vectors`` (one dataloader's images, batch by batch) and
    ``_text_vectors`` (all of a dataloader's texts at once), each giving normalised rows and their norms."""

    def __init__(self, meta: ModelMeta):
        self.mteb_model_meta = meta
        self._warned: set[str] = set()
        self.counts = EncodeCounts()

    def _raw(self, task: str, sides: dict[str, Vectors]) -> list[np.ndarray]:
        """The sides' raw features, or their normalised rows (and one warning per task) when a side has no norms."""
        raw = [r for _, r, _ in sides.values() if r is not None]
        if len(raw) == len(sides):
            if not all(exact for _, _, exact in sides.values()) and f"{task}:rebuilt" not in self._warned:
                self._warned.add(f"{task}:rebuilt")
                log.warning("mteb task %s: vectors kept with norms but without raw rows (cache entries of an earlier "
                            "release, or a model that gives norms only, such as an API model): their raw features "
                            "are normalised row x norm (within ~1e-7 relative of the model's output, so a probe can "
                            "differ in a prediction); delete such cache entries to re-encode them once", task)
            return raw
        if task not in self._warned:
            self._warned.add(task)
            log.warning("mteb task %s: %s vectors without norms (cache entries written before clipcache kept each "
                        "row's norm, or a model that cannot give them): mteb receives normalised vectors, not the "
                        "raw features mteb's CLIP-style wrappers give (cosine scores are the same; image + text "
                        "sums, clustering and distances are not)", task,
                        " and ".join(name for name, (_, r, _) in sides.items() if r is None))
        return [rows for rows, _, _ in sides.values()]

    def encode(self, inputs: Any, *, task_metadata: Any, hf_split: str, hf_subset: str,
               prompt_type: PromptType | None = None, **kwargs: Any) -> np.ndarray:
        # mteb's prompt_type says whether the inputs are a retrieval task's queries or its corpus (None: a task
        # without the two). Texts of queries are embedded as queries: the same for a local model (CLIP-style models
        # take no instructions, as in mteb's own CLIP / OpenCLIP wrappers), a role or prefix for an api: model that
        # sends them (ResolvedModel.text_roles). mteb's task prompts and instructions are not used.
        role = "query" if prompt_type == PromptType.query else "document"
        kind = "none" if prompt_type is None else role
        self.counts.by_prompt_type[kind] = self.counts.by_prompt_type.get(kind, 0) + len(inputs.dataset)
        columns = input_columns(inputs.dataset)
        refused = sorted(columns & set(REFUSED))
        if refused:
            raise ConfigError(f"mteb task {task_metadata.name} asks for {', '.join(refused)} inputs; clipcache's "
                              f"models encode images and texts only")
        if not columns & set(SUPPORTED):
            raise ConfigError(f"mteb task {task_metadata.name} passes no text or image column "
                              f"(columns: {', '.join(sorted(columns)) or 'none'})")
        texts: list[str] = []
        image_batches = (batch["image"] for batch in self._batches(inputs, texts) if "image" in batch)
        images = self._image_vectors(image_batches, len(inputs.dataset), task_metadata.name) \
            if "image" in columns else None
        if images is None:
            for _ in self._batches(inputs, texts):  # a text-only loader: collect its texts
                pass
        text_vectors = self._text_vectors(texts, task_metadata.name, role) if texts else None
        if images is not None and text_vectors is not None:
            if len(images[0]) != len(text_vectors[0]):
                raise DatasetError(f"mteb task {task_metadata.name}: {len(images[0])} images and "
                                   f"{len(text_vectors[0])} texts in inputs that pair them")
            # raw features summed, as mteb's CLIP-style wrappers sum them: each side weighs by its norm
            image_part, text_part = self._raw(task_metadata.name, {"image": images, "text": text_vectors})
            return image_part + text_part
        out = images if images is not None else text_vectors
        if out is None:
            raise DatasetError(f"mteb task {task_metadata.name}: an empty input")
        [vectors] = self._raw(task_metadata.name, {"image" if images is not None else "text": out})
        return vectors

    @staticmethod
    def _batches(inputs: Any, texts: list[str]) -> Iterable[dict[str, Any]]:
        for batch in inputs:
            if "text" in batch:
                texts.extend(str(t) for t in batch["text"])
            yield batch

    @abstractmethod
    def _image_vectors(self, batches: Iterable[list[Image.Image]], n: int, task: str) -> Vectors:
        """The images' normalised vectors and norms, in order (the uncached encoder encodes them, the cached one
        reads or adds them)."""

    @abstractmethod
    def _text_vectors(self, texts: list[str], task: str, role: str) -> Vectors:
        """The texts' normalised vectors and norms, in order, embedded as ``role`` (``query`` or ``document``)."""


class UncachedMtebEncoder(_MtebEncoder):
    """The model itself, no cache: every call encodes (the reference a cached run must equal)."""

    def __init__(self, model: EmbeddingModel, meta: ModelMeta):
        super().__init__(meta)
        self.model = model

    def _image_vectors(self, batches: Iterable[list[Image.Image]], n: int, task: str) -> Vectors:
        parts = []
        for images in batches:
            parts.append(self.model.encode_images_with_raw(torch.stack([self.model.image_transform(i)
                                                                        for i in images])))
            self.counts.images_encoded += len(images)
        if not parts:
            return np.empty((0, 0), np.float32), np.empty((0, 0), np.float32), True
        raw = None if any(r is None for _, _, r in parts) else np.concatenate([r for _, _, r in parts
                                                                              if r is not None])
        return np.concatenate([v for v, _, _ in parts]), raw, True

    def _text_vectors(self, texts: list[str], task: str, role: str) -> Vectors:
        self.counts.texts_encoded += len(texts)
        with self.model.texts_as("query" if role == "query" else "prompt"):  # a prompt: a document to an API model
            vectors, _, raw = self.model.encode_texts_with_raw(texts)
        return vectors, raw, True


class CachedMtebEncoder(_MtebEncoder):
    """A clipcache model session behind mteb's encoder protocol, answering from the cache. ``cached_only``: a
    missing vector is a CacheMissError instead of a forward pass (rescore)."""

    def __init__(self, session: EncodeSession, store: EmbeddingStore, *, batch_size: int, cached_only: bool = False,
                 progress: StageProgress | None = None):
        from clipcache.tasks.models.loader import library_version

        super().__init__(model_meta(f"clipcache/{session.resolved.display_name}",
                                    f"{session.resolved.fingerprint}@mteb{library_version('mteb')}"))
        self.session = session
        self.store = store
        self.batch_size = batch_size
        self.cached_only = cached_only
        self.progress = progress
        self.images = ContentPool(store, digest(image_pool_fields(session)))

    def _image_vectors(self, batches: Iterable[list[Image.Image]], n: int, task: str) -> Vectors:
        from clipcache.tasks.contract import CacheMissError

        known = self.images.index()
        made: dict[bytes, np.ndarray] = {}  # vectors encoded now, by digest
        made_raw: dict[bytes, np.ndarray | None] = {}  # their raw rows (None: the model gave none)
        unseen: set[bytes] = set()  # cached_only: digests the pool lacks
        order: list[bytes] = []
        # one new batch entry per call, named uniquely (a batch is found through the pool's markers, never by key)
        fields = {"role": f"{IMAGE_ROLE}-batch", "pool": self.images.pool, "task": task, "batch": uuid.uuid4().hex}
        with ExitStack() as stack:
            writer = None
            for images in batches:
                digests = [image_sha256(image) for image in images]
                order.extend(digests)
                # the first input of each digest the pool lacks, in batch order: mteb's batches, less the known ones
                todo = {d: i for i, d in reversed(list(enumerate(digests)))
                        if d not in known and d not in made and d not in unseen}
                if not todo:
                    continue
                if self.cached_only:
                    unseen.update(todo)
                    continue
                if writer is None:  # capacity: every input; the entry keeps the rows written
                    writer = stack.enter_context(self.store.writer(fields, "image", capacity=n,
                                                                   aux={DIGEST_ARRAY: AuxSpec("uint8", (32,))}))
                model = self.session.model
                rows = sorted(todo.values())
                # with each row's norm and raw row (the writer's first rows decide whether the batch keeps them)
                vectors, norms, raw = model.encode_images_with_raw(torch.stack([model.image_transform(images[i])
                                                                                for i in rows]))
                raw = None if norms is None else raw
                start = self.counts.images_encoded
                writer.add(vectors, np.arange(start, start + len(rows), dtype=np.int64), norms=norms, raw=raw,
                           **{DIGEST_ARRAY: digests_array([digests[i] for i in rows])})
                made.update({digests[i]: vectors[j] for j, i in enumerate(rows)})
                made_raw.update({digests[i]: None if raw is None else raw[j] for j, i in enumerate(rows)})
                self.counts.images_encoded += len(rows)
            if unseen:
                raise CacheMissError([f"{len(unseen)} image embeddings of mteb task {task}"])
            if writer is not None:
                ref = writer.finish(meta={"model": self.session.resolved.display_name, "mteb_task": task})
                self.images.register(ref.key)
                _add(self.counts.image_keys, [ref.key])
        cached = [known[d] for d in order if d not in made]
        self.counts.images_cached += len(cached)
        _add(self.counts.image_keys, (key for key, _ in cached))
        stored = self.images.gather(cached)
        stored_raw, exact = self.images.gather_raw(cached)
        if not order:
            return np.empty((0, 0), np.float32), np.empty((0, 0), np.float32), True
        dim = stored.shape[1] if len(cached) else len(next(iter(made.values())))
        out = np.empty((len(order), dim), np.float32)
        out_raw: np.ndarray | None = np.empty((len(order), dim), np.float32)
        if stored_raw is None or any(v is None for v in made_raw.values()):
            out_raw = None
        j = 0
        for i, d in enumerate(order):
            if d in made:
                out[i] = made[d]
                if out_raw is not None:
                    out_raw[i] = made_raw[d]
            else:
                out[i] = stored[j]
                if out_raw is not None and stored_raw is not None:
                    out_raw[i] = stored_raw[j]
                j += 1
        return out, out_raw, exact

    def _text_vectors(self, texts: list[str], task: str, role: str) -> Vectors:
        from clipcache.tasks.contract import CacheMissError
        from clipcache.tasks.encode.stage import encode_prompts, prompt_pool_fields
        from clipcache.tasks.progress import StageProgress

        # one pool of texts for a model that embeds every text alike (local models: keys of earlier runs stay); a
        # pool of its queries beside it for one that does not
        pool_role = "query" if role == "query" and self.session.resolved.text_roles else "prompt"
        pool = TextPool(self.store, digest(prompt_pool_fields(self.session, pool_role)))
        missing = set(pool.missing(texts))
        if missing and self.cached_only:
            why = (" (an experiment of its own, mteb_roles: runs before it embedded the queries as documents)"
                   if pool_role == "query" else "")
            raise CacheMissError([f"{len(missing)} {role} text embeddings of mteb task {task}{why}"])
        if missing:
            outcome = encode_prompts(self.session, texts, self.store, self.batch_size,
                                     self.progress or StageProgress(enabled=False), f"mieb:{task}", role=pool_role)
            self.counts.texts_encoded += outcome.encoded
            lookup = outcome.lookup
        else:
            lookup = pool.lookup(texts)
        self.counts.texts_cached += sum(1 for t in texts if t not in missing)
        _add(self.counts.text_keys, lookup.batch_keys)
        where = [(lookup.batch_keys[b], int(r)) for b, r in zip(lookup.batch.tolist(), lookup.row.tolist(),
                                                                 strict=True)]
        raw, exact = pool.gather_raw(where)
        return pool.gather(lookup), raw, exact
