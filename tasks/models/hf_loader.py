"""Hugging Face transformers CLIP-family models (CLIP, Chinese-CLIP, SigLIP, AltCLIP): hub ids, local folders, and
ModelScope ids (downloaded to a local folder, then loaded the same way)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.custom_code import check_folder
from clipcache.tasks.models.loader import ModelLoader, ResolvedModel, dir_checkpoint, library_version
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import TwoTowerModel

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def is_siglip2(model_type: str, tokenizer_class: str | None) -> bool:
    """SigLIP 2: its own model type (NaFlex), or a fixed-resolution checkpoint (model type ``siglip``) with SigLIP 2's
    Gemma tokenizer (SigLIP's own is a T5 SentencePiece one)."""
    return model_type == "siglip2" or (model_type == "siglip" and (tokenizer_class or "").startswith("Gemma"))


def text_preprocessing(source: str) -> dict[str, bool]:
    """The text rule clipcache applies beyond the tokenizer's own (docs/preprocessing.md), read from a folder's
    config.json and tokenizer_config.json, or, for a hub id (not fetched when resolving), from its name: SigLIP 2 is
    lowercased, as big_vision trains and evaluates it; HF's Gemma tokenizer of its fixed-resolution checkpoints does
    not. Empty for every other model, so their identities (and cache keys) are what they were."""
    import json

    path = Path(source).expanduser()
    if path.is_dir():
        def field(file: str, key: str) -> str | None:
            try:
                value = json.loads((path / file).read_text(encoding="utf-8")).get(key)
            except (OSError, ValueError, AttributeError):
                return None
            return value if isinstance(value, str) else None

        siglip2 = is_siglip2(field("config.json", "model_type") or "", field("tokenizer_config.json",
                                                                             "tokenizer_class"))
    else:
        siglip2 = "siglip2" in source.lower()
    return {"lowercase": True} if siglip2 else {}


def resolve_hf(loader: str, source: str, spec: ModelSpec, memo: FileHashMemo, library: str,
               named: bool = False) -> ResolvedModel:
    """A local folder (by content) or a hub id (by id and revision). ``named``: the folder stands for a name the user
    gave (a bundled model, a ModelScope download), which already tells it apart: it gets no folder label."""
    base: dict[str, Any] = {"loader": loader, "library": f"{library} {library_version(library)}"}
    if text := text_preprocessing(source):  # a text-only rule, recorded where it applies (SigLIP 2)
        base["text_preprocessing"] = text
    path = Path(source).expanduser()
    if path.is_dir():
        if loader == "hf" and not (path / "config.json").is_file():
            raise ModelError(f"model {spec.model_name!r}: {path} has no config.json (not a Hugging Face model folder)")
        check_folder(path)  # before anything is hashed or loaded: a folder that asks to run code is refused
        checkpoint, label = dir_checkpoint(path.resolve(), memo)
        return ResolvedModel(loader, str(path.resolve()), None, None, {**base, "content": checkpoint[len("sha256:"):]},
                             checkpoint, None if named else label)
    if spec.hub == "local" or source.startswith(("/", ".", "~")):
        raise ModelError(f"model {spec.model_name!r}: folder {path} does not exist")
    revision = spec.revision or "main"
    return ResolvedModel(loader, source, None, spec.revision, {**base, "hf_hub": source, "revision": revision},
                         f"hub:{source}@{revision}", spec.revision)


def modelscope_folder(spec: ModelSpec, model_cache_dir: str | None) -> str:
    """The local copy of a ModelScope model repo (downloaded with modelscope's snapshot_download if needed).

    snapshot_download only copies files (it has no trust_remote_code: it imports nothing from the repo); the folder
    is then checked for code requests by :func:`resolve_hf`, as any local folder is."""
    try:
        from modelscope import snapshot_download

        folder = snapshot_download(spec.model_name, revision=spec.revision, cache_dir=model_cache_dir,
                                   endpoint=os.environ.get("MODELSCOPE_ENDPOINT"))
    except Exception as e:  # modelscope raises many types for network / missing repo problems
        raise ModelError(f"could not fetch {spec.model_name!r} from ModelScope: {type(e).__name__}: {e}") from e
    return str(folder)


class HFLoader(ModelLoader):
    name = "hf"
    description = "Hugging Face transformers CLIP / Chinese-CLIP / SigLIP: ORG/NAME hub id or a local folder"
    priority = 60

    def claims(self, spec: ModelSpec) -> bool:
        path = Path(spec.model_name).expanduser()
        return path.is_dir() or bool(HUB_ID.match(spec.model_name))

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        return resolve_hf("hf", spec.model_name, spec, memo, "transformers")

    def load(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None) -> TwoTowerModel:
        from clipcache.tasks.models.hf_model import HFClipModel

        return HFClipModel(resolved, device, amp, cache_dir)

    def known_names(self) -> list[str]:
        from clipcache.tasks.models.presets import presets

        return [p["id"] for p in presets()["huggingface"]]


class ModelScopeLoader(HFLoader):
    """A ModelScope model repo, downloaded (or found in the local copy) with modelscope's snapshot_download;
    ``MODELSCOPE_ENDPOINT`` (a full URL) points it at a mirror."""

    name = "modelscope"
    description = "a ModelScope ORG/NAME id of a transformers CLIP-family model (downloaded, then loaded as hf)"
    priority = 10  # asked first: it claims ids only when the hub is modelscope

    def claims(self, spec: ModelSpec) -> bool:
        return spec.hub == "modelscope" and bool(HUB_ID.match(spec.model_name)) and not Path(spec.model_name).exists()

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        return resolve_hf("hf", modelscope_folder(spec, model_cache_dir), spec, memo, "transformers", named=True)

    def known_names(self) -> list[str]:
        from clipcache.tasks.models.presets import presets

        return [p["id"] for p in presets()["modelscope"]]


LOADER = HFLoader()
MODELSCOPE = ModelScopeLoader()
