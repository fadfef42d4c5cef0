"""Model folders and hub repositories that ask to run their own Python code: clipcache refuses them.

A model folder is data, and clipcache never runs code from one. The libraries we load with would, in three ways:

- transformers imports a repository's own modules when a config file names them in ``auto_map`` (config.json,
  tokenizer_config.json, preprocessor_config.json, processor_config.json). Without ``trust_remote_code`` it asks
  "Do you wish to run the custom code? [y/N]" on stdin, so a ``y`` piped into clipcache would run them.
- sentence-transformers imports the module classes ``modules.json`` (and a Router's ``router_config.json``) names.
- open_clip hands an ``open_clip_config.json``'s ``tokenizer_kwargs`` to transformers as they are, and builds an HF
  text tower from whatever ``hf_model_name`` names, without ``trust_remote_code``.

So every call into those libraries passes ``trust_remote_code=False`` where it can, runs under :func:`no_prompts`
(nothing can answer a prompt), and is preceded by a check of the files that ask for code, which refuses in one
line that says how to opt in: a model-loader plugin that makes its own trust decision.

The one built-in exception is the ecosystem's explicit opt-in, ``trust_remote_code`` on one model (the CLI's
``--trust_remote_code``, the key in an evalscope model entry or a ModelSpec), honoured only by the loaders that need
it (``internvl``). Such a loader runs the code of that model's folder (a local one, or the snapshot of its hub
repository, downloaded first without importing anything) and nothing else: :func:`code_files` hashes every Python
file the folder supplies into the model's identity (a changed file is another experiment) and
:func:`local_auto_map` refuses an ``auto_map`` that names another repository's code.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clipcache.storage.errors import ModelError

# The files transformers reads ``auto_map`` from; in a folder every ``*config.json`` is read (sub-models included).
HUB_CONFIG_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
ST_NAMESPACE = "sentence_transformers."


def custom_code_refusal(where: str | Path, reason: str) -> ModelError:
    return ModelError(f"{where} asks to run its own Python code ({reason}); clipcache never runs code from a model "
                      f"folder. To load it anyway, write a model-loader plugin (see docs/plugins.md) that loads it "
                      f"with your own trust decision")


def code_files(folder: Path) -> dict[str, str]:
    """SHA-256 of every (non-hidden) Python file under a model folder, by path relative to it: the code a trusted
    folder supplies, recorded in its identity."""
    from clipcache.storage.hashing import sha256_file

    files = sorted(p for p in folder.rglob("*.py") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in files}


def local_auto_map(folder: Path) -> None:
    """Refuse a trusted folder whose ``auto_map`` names code of another hub repository (``org/repo--module.Class``):
    the opt-in covers the code in the folder the user named, never a download of someone else's."""
    for name in HUB_CONFIG_FILES:
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8-sig"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        refs = data.get("auto_map") if isinstance(data, dict) else None
        values = refs.values() if isinstance(refs, dict) else [refs]
        for ref in (r for v in values for r in (v if isinstance(v, list) else [v])):
            if isinstance(ref, str) and "--" in ref:
                raise ModelError(f"{folder / name}: its auto_map names {ref!r}, code from another repository; "
                                 f"trust_remote_code runs only the code of the folder given")


def one_line(error: BaseException) -> str:
    """A library's message on one line (the CLI prints one line per error; transformers' messages span several)."""
    return " ".join(str(error).split())


def checkpoint_refusal(where: str | Path, error: pickle.UnpicklingError) -> ModelError:
    """One line for a weights file that torch's restricted unpickler (``weights_only=True``) would not load. torch's
    own message is a page long and suggests ``weights_only=False``, which would run the file's pickle."""
    text = str(error)
    if not text.startswith("Weights only load failed"):
        return ModelError(f"{where}: the weights file is not a readable checkpoint ({one_line(error)[:300]})")
    found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    what = repr(found.group(1)) if found else "an object other than tensors and plain containers"
    return ModelError(f"{where}: refused to load {what} from a checkpoint pickle (clipcache loads .pt/.bin/.pth "
                      f"weights with torch.load(weights_only=True): tensors and plain containers only; save the "
                      f"weights as .safetensors or as a plain state_dict)")


def _foreign_classes(refs: Any) -> list[str]:
    return [ref for ref in refs if isinstance(ref, str) and not ref.startswith(ST_NAMESPACE)]


def code_request(name: str, data: Any) -> str | None:
    """Why the parsed JSON file called ``name`` asks to import code, or None."""
    if name == "modules.json" and isinstance(data, list):
        foreign = _foreign_classes(m.get("type") for m in data if isinstance(m, dict))
        return f"modules.json names the module class {foreign[0]!r}, outside sentence-transformers" if foreign else None
    if not isinstance(data, dict):
        return None
    if "auto_map" in data:
        refs = data["auto_map"].values() if isinstance(data["auto_map"], dict) else [data["auto_map"]]
        names = sorted({str(r) for ref in refs for r in (ref if isinstance(ref, list) else [ref]) if r})
        return f"its auto_map names {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
    if "custom_pipelines" in data:
        return "its 'custom_pipelines' name code of its own"
    if name == "router_config.json" and isinstance(data.get("types"), dict):
        foreign = _foreign_classes(data["types"].values())
        return f"it names the module class {foreign[0]!r}, outside sentence-transformers" if foreign else None
    return None


def check_file(path: Path, where: str | Path | None = None) -> None:
    """Refuse ``path`` if it asks for code (a file that is not JSON is left to the library to report)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    if (reason := code_request(path.name, data)) is not None:
        raise custom_code_refusal(where or path, reason)


def check_folder(folder: Path) -> None:
    """Refuse a local model folder (transformers, sentence-transformers or open_clip) that asks for code."""
    for path in sorted(folder.rglob("*.json")):
        hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
        if not hidden and path.is_file() and (path.name.endswith("config.json") or path.name == "modules.json"):
            check_file(path)


def check_hf_source(source: str, *, revision: str | None = None, cache_dir: str | None = None,
                    files: tuple[str, ...] = HUB_CONFIG_FILES) -> None:
    """A local folder, or a hub repository's ``files`` (fetched as the library would fetch them), checked."""
    path = Path(source).expanduser()
    if path.is_dir():
        check_folder(path)
        return
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    for name in files:
        try:
            local = hf_hub_download(source, name, revision=revision, cache_dir=cache_dir)
        except EntryNotFoundError:  # the repo has no such file (or, offline, no copy of it): nothing to check
            continue
        check_file(Path(local), f"{source}/{name}")


@contextmanager
def no_prompts() -> Iterator[None]:
    """Loading reads no answer from stdin: a library's "[y/N]" prompt (transformers' remote-code one) gets EOF,
    which it takes as a refusal, whatever the user or a pipe would have typed."""
    stdin = sys.stdin
    sys.stdin = io.StringIO()
    try:
        yield
    finally:
        sys.stdin = stdin
