"""open_clip models: architecture + pretrained tag or checkpoint file, ``local-dir:`` folders and ``hf-hub:`` names.

Resolution reads open_clip's architecture JSON files directly, so naming a model (and a cache hit) never imports
open_clip; only a pretrained tag's metadata needs the library.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import ConfigError, ModelError
from clipcache.storage.hashing import FileHashMemo
from clipcache.tasks.models.loader import (
    RANDOM_INIT_SEED,
    WEIGHT_SUFFIXES,
    ModelLoader,
    ResolvedModel,
    dir_checkpoint,
    file_checkpoint,
    library_version,
)
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import TwoTowerModel

BUNDLED = {"tiny-shapes-clip": Path(__file__).parent / "assets" / "tiny-shapes-clip"}


@cache
def _config_dir() -> Path | None:
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "model_configs"


def _extra_configs(arch_config: str | None) -> dict[str, Path]:
    if arch_config is None:
        return {}
    path = Path(arch_config).expanduser()
    if not path.exists():
        raise ConfigError(f"arch_config: {path} does not exist (expected an open_clip architecture JSON or directory)")
    files = [path] if path.is_file() else sorted(path.glob("*.json"))
    return {f.stem: f for f in files}


def architectures(arch_config: str | None = None) -> dict[str, Path | None]:
    """open_clip's architecture names -> their JSON config files (plus those of ``arch_config``). Architectures
    registered in this process with ``open_clip.add_model_config`` count too (None: no file of their own)."""
    folder = _config_dir()
    found: dict[str, Path | None] = {p.stem: p for p in sorted(folder.glob("*.json"))} if folder else {}
    if "open_clip" in sys.modules:  # only if already imported: naming a model must not import it
        found.update({name: None for name in sys.modules["open_clip"].list_models() if name not in found})
    return {**found, **_extra_configs(arch_config)}


def _arch_config(arch: str, arch_config: str | None) -> dict[str, Any]:
    known = architectures(arch_config)
    if arch not in known:
        raise ModelError(f"Unknown open_clip architecture {arch!r}")
    path = known[arch]
    if path is None:
        return dict(sys.modules["open_clip"].get_model_config(arch))
    return json.loads(path.read_text(encoding="utf-8"))


def _tag_config(arch: str, tag: str) -> dict[str, Any] | None:
    import open_clip

    return open_clip.get_pretrained_cfg(arch, tag) or None


class OpenClipLoader(ModelLoader):
    name = "open_clip"
    description = "open_clip: ARCH [--pretrained TAG|FILE], local-dir:PATH, hf-hub:ORG/REPO, bundled models"
    priority = 30

    def claims(self, spec: ModelSpec) -> bool:
        name = spec.model_name
        if name in BUNDLED or name.startswith(("local-dir:", "hf-hub:")):
            return True
        if name.replace("/", "-") in architectures(spec.arch_config):
            return True
        return (Path(name).expanduser() / "open_clip_config.json").is_file()

    def known_names(self) -> list[str]:
        return sorted(BUNDLED) + sorted(architectures())

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        base = {"loader": "open_clip", "library": f"open_clip {library_version('open_clip_torch')}"}
        name = spec.model_name
        if name in BUNDLED:
            name = f"local-dir:{BUNDLED[name]}"
        elif not name.startswith(("local-dir:", "hf-hub:")) and Path(name).expanduser().is_dir():
            name = f"local-dir:{name}"
        if name.startswith("local-dir:"):
            path = Path(name[len("local-dir:"):]).expanduser().resolve()
            config = path / "open_clip_config.json"
            if not config.is_file():
                raise ModelError(f"model {spec.model_name!r}: {config} not found (a local-dir: model needs "
                                 f"open_clip_config.json and a weights file)")
            weights = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES]
            if not weights:
                raise ModelError(f"model {spec.model_name!r}: no weights file (*.safetensors, *.bin, *.pth) in {path}")
            checkpoint, label = dir_checkpoint(path, memo)
            identity = {**base, "config": json.loads(config.read_text()), "weights": checkpoint[len("sha256:"):]}
            # a bundled model, however it is named, is told apart by its name (and keeps evalscope's result layout)
            bundled = path in {p.resolve() for p in BUNDLED.values()}
            return ResolvedModel("open_clip", f"local-dir:{path}", None, None, identity, checkpoint,
                                 None if bundled else label)
        if name.startswith("hf-hub:"):
            revision = spec.revision or "main"
            identity = {**base, "hf_hub": name[len("hf-hub:"):], "revision": revision}
            return ResolvedModel("open_clip", name, None, spec.revision, identity, f"hub:{name}@{revision}",
                                 spec.revision)
        arch = name.replace("/", "-")
        identity = {**base, "arch": arch, "config": _arch_config(arch, spec.arch_config)}
        extra = {"arch_config": spec.arch_config}
        pretrained = spec.pretrained
        if pretrained is None:
            identity["weights"] = f"random-init-seed-{RANDOM_INIT_SEED}"
            return ResolvedModel("open_clip", arch, None, None, identity, f"random-init:{RANDOM_INIT_SEED}", **extra)
        path = Path(pretrained).expanduser()
        if path.is_file():
            checkpoint, label = file_checkpoint(path, memo)
            identity["weights"] = checkpoint.removeprefix("sha256:")
            return ResolvedModel("open_clip", arch, str(path.resolve()), None, identity, checkpoint, label, **extra)
        if path.suffix in WEIGHT_SUFFIXES or "/" in pretrained:
            raise ModelError(f"pretrained: checkpoint file {pretrained} does not exist")
        cfg = _tag_config(arch, pretrained)
        if cfg is None:
            import open_clip

            tags = open_clip.list_pretrained_tags_by_model(arch)
            raise ModelError(f"pretrained {pretrained!r} is neither a file nor a known tag of {arch}"
                             f"{' (known tags: ' + ', '.join(tags) + ')' if tags else ''}")
        identity["pretrained"] = pretrained
        identity["pretrained_cfg"] = {k: v for k, v in cfg.items() if k not in ("url", "hf_hub", "hf_file",
                                                                                "hf_subdir")}
        return ResolvedModel("open_clip", arch, pretrained, None, identity, f"tag:{pretrained}", pretrained, **extra)

    def load(self, resolved: ResolvedModel, device: torch.device, amp: bool, cache_dir: str | None) -> TwoTowerModel:
        from clipcache.tasks.models.open_clip_model import OpenClipModel

        return OpenClipModel(resolved, device, amp, cache_dir)


LOADER = OpenClipLoader()
