"""What a model loader is: resolution (light: no torch, no weights) and loading (on demand).

A loader turns a :class:`ModelSpec` into a :class:`ResolvedModel` without building the model: the identity that goes
into cache keys (source and weights by content hash or hub revision, architecture / preprocessing config, the major.minor
version of the library that runs it) and the checkpoint identity and label that go into results. Weights are loaded
only when something must be encoded, through ``load``.

Loaders live in a registry (``clipcache.tasks.models.LOADERS``); third-party packages add theirs with a Python entry
point in the group ``clipcache.models`` (see docs/plugins.md).
"""

from __future__ import annotations

import importlib.metadata
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import EmbeddingModel

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".npz")


# Identity fields that change text vectors only (image entries are keyed without them).
TEXT_ONLY = ("text_preprocessing",)

# Architectures named without weights get random ones, seeded: they are part of the cache key (benchmarks use them).
RANDOM_INIT_SEED = 0

@dataclass(frozen=True)
class ResolvedModel:
    loader: str  # the registry name of the loader that resolved it
    source: str  # what the loader is given: an open_clip name, or an HF id / local directory
    pretrained: str | None
    revision: str | None
    identity: dict[str, Any]  # everything that changes vectors: part of every cache key
    checkpoint: str = ""  # the weights' identity in results: "tag:..", "sha256:..", "hub:..@..", "random-init:0"
    checkpoint_label: str | None = None  # readable: the tag, "<file or folder>@<hash prefix>", a revision
    arch_config: str | None = None  # open_clip: an extra architecture JSON file or folder to register before loading

    @property
    def display_name(self) -> str:
        name = self.source.split("local-dir:")[-1].rstrip("/").split("/")[-1]
        return f"{name} ({self.checkpoint_label})" if self.checkpoint_label else name

    @property
    def image_identity(self) -> dict[str, Any]:
        """What image entries are keyed by: the identity without its text-only rules (SigLIP 2's lowercasing,
        InternVL's prompt prefix), so a text rule never re-encodes images. Equal to the identity for every model
        that has none."""
        return {k: v for k, v in self.identity.items() if k not in TEXT_ONLY}

    @property
    def fingerprint(self) -> str:
        return digest(self.identity)[:16]

    @property
    def text_roles(self) -> bool:
        """Whether a text is embedded differently as a query than as a document (``EmbeddingModel.texts_as``): False
        for every local model, which embeds every text the same way; an ``api:`` model says
        (tasks/models/api_loader.py). Known without loading the model, so a cached run asks it too."""
        return False


def library_version(distribution: str) -> str:
    """major.minor of an installed distribution (part of identities: a new release may change vectors)."""
    return ".".join(importlib.metadata.version(distribution).split(".")[:2])


def dir_fingerprint(path: Path, memo: FileHashMemo) -> str:
    """Content digest of every (non-hidden) file under a model folder."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                            p.relative_to(path).parts))
    return memo.fingerprint(files, root=path)


def dir_checkpoint(path: Path, memo: FileHashMemo) -> tuple[str, str]:
    """(identity, label) of a model folder, like :func:`file_checkpoint`: training runs save folders with the same
    names (``checkpoint-1000``), so the name alone would put two of them in one result file."""
    content = dir_fingerprint(path, memo)
    return f"sha256:{content}", f"{path.name}@{content[:8]}"


def file_checkpoint(path: Path, memo: FileHashMemo) -> tuple[str, str]:
    """(identity, label) of a weights file: its content, and its name with a hash prefix, so two ``epoch_32.pt`` in
    different folders are told apart and a moved file stays the same checkpoint."""
    sha = memo.sha256(path)
    return f"sha256:{sha}", f"{path.name}@{sha[:8]}"


class ModelLoader(ABC):
    """One way of turning names into models. ``priority``: order in which ``model_type auto`` asks ``claims``."""

    name: str = ""
    description: str = ""
    priority: int = 100
    # Whether the loader honours a ModelSpec's trust_remote_code (runs the code of the model's folder); for every
    # other loader the opt-in is an error, so it never silently means nothing.
    runs_remote_code: bool = False

    @abstractmethod
    def claims(self, spec: ModelSpec) -> bool:
        """Whether ``model_type auto`` should use this loader for ``spec`` (cheap: no torch, no network)."""

    @abstractmethod
    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        """The load-free identity of ``spec`` (ModelError / ConfigError naming the problem if there is none)."""

    @abstractmethod
    def load(self, resolved: ResolvedModel, device: torch.device, amp: bool,
             cache_dir: str | None) -> EmbeddingModel:
        """Build the model (weights on ``device``)."""

    def known_names(self) -> list[str]:
        """Names this loader can suggest for typos and list in `clipcache models`."""
        return []
