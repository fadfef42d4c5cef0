"""InternVL-C and InternVL-G (InternVL 1.0, ``OpenGVLab/InternVL-14B-224px``) under the names of InternVL's
clip_benchmark fork: ``--model_type internvl --model internvl_g_retrieval_hf --pretrained <Hugging Face folder>``.

The model ships its code in its Hugging Face folder (``auto_map`` → ``modeling_internvl.py``), so it loads only with
the explicit opt-in ``trust_remote_code`` on that model. The identity then records the opt-in and the SHA-256 of
every Python file of the folder, and the experiment's checkpoint names that code (``+remote-code:<hash>``): a
changed code file is a new cache key and a new experiment.

The model name picks the head and the image rule, as the fork does: ``internvl_c_*`` encodes images with
``encode_image(pixels, mode='InternVL-C')`` (the vision backbone's attention-pooled projection), ``internvl_g_*``
with ``mode='InternVL-G'`` (backbone + QLLaMA query tokens, the two projections normalised and summed);
``*_classification*`` resizes the short side and centre-crops (the folder's CLIPImageProcessor as saved),
``*_retrieval*`` resizes the whole image to the square input size. Texts follow the model card: ``summarize:``
prefix, the slow Llama tokenizer with BOS and EOS, padded with id 0 on the right to 80 tokens.

``--pretrained`` may also name the hub repository (``OpenGVLab/InternVL-14B-224px`` or ``hf-hub:...``, with
``--revision``): its files are taken from the Hugging Face cache or downloaded into it (``HF_ENDPOINT``,
``HF_HUB_OFFLINE`` and ``--model_cache_dir`` apply) with huggingface_hub's ``snapshot_download``, which imports
nothing; the snapshot folder is then treated exactly as a local folder (the same identity by content, the same code
hashes, re-checked before the code runs), so a downloaded copy and a local one with the same files are one model.

The ``.pth`` form of the seed (``internvl_c_13b_224px.pth``) needs InternVL's own repository code: it is refused in
one line that says to use the Hugging Face folder, whose InternVL-C head is the same model.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipcache.storage.errors import ModelError
from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.models.custom_code import code_files, local_auto_map, one_line
from clipcache.tasks.models.hf_loader import HUB_ID
from clipcache.tasks.models.loader import (
    WEIGHT_SUFFIXES,
    ModelLoader,
    ResolvedModel,
    dir_checkpoint,
    library_version,
)
from clipcache.tasks.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from clipcache.tasks.models.base import EmbeddingModel

# (image head, image rule) per model name of InternVL's clip_benchmark fork (clip_benchmark/models/internvl.py);
# the names without _hf load the .pth there, which clipcache reads from the Hugging Face folder instead.
MODELS: dict[str, tuple[str, str]] = {
    "internvl_c_classification": ("InternVL-C", "classification"),
    "internvl_c_retrieval": ("InternVL-C", "retrieval"),
    "internvl_c_classification_hf": ("InternVL-C", "classification"),
    "internvl_c_retrieval_hf": ("InternVL-C", "retrieval"),
    "internvl_g_classification_hf": ("InternVL-G", "classification"),
    "internvl_g_retrieval_hf": ("InternVL-G", "retrieval"),
}
# InternVL's text rule (model card of OpenGVLab/InternVL-14B-224px and the fork's InternVLTokenizer).
TEXT = {"prefix": "summarize:", "max_length": 80, "padding": "max_length", "padding_side": "right",
        "pad_token_id": 0, "add_bos_token": True, "add_eos_token": True}
HF_REPO = "OpenGVLab/InternVL-14B-224px"


def hub_repo(spec: ModelSpec) -> str | None:
    """The Hugging Face repository ``--pretrained`` names (``hf-hub:ORG/NAME``, or ``ORG/NAME`` that is no local
    path), or None for a local folder or file."""
    where = spec.pretrained or ""
    if where.startswith("hf-hub:"):
        return where[len("hf-hub:"):]
    if spec.hub != "local" and HUB_ID.match(where) and not where.startswith((".", "~")) \
            and not Path(where).expanduser().exists():
        return where
    return None


def _snapshot(spec: ModelSpec, repo: str, model_cache_dir: str | None) -> Path:
    """The repository's files in the Hugging Face cache (``--model_cache_dir``, else the hub's own), downloaded
    from ``HF_ENDPOINT`` when missing (offline, HF_HUB_OFFLINE=1: the cached copy only). Downloading imports
    nothing; the code runs only after it is hashed, as a local folder's."""
    from huggingface_hub import snapshot_download

    if not HUB_ID.match(repo):
        raise ModelError(f"--pretrained {spec.pretrained}: {repo!r} is not a Hugging Face repository id (ORG/NAME)")
    if spec.hub == "modelscope":
        raise ModelError(f"--pretrained {spec.pretrained}: InternVL is fetched from the Hugging Face hub only "
                         f"(HF_ENDPOINT for a mirror); download a ModelScope copy yourself and give its folder")
    try:
        folder = snapshot_download(repo, revision=spec.revision, cache_dir=model_cache_dir,
                                   endpoint=os.environ.get("HF_ENDPOINT") or None)
    except Exception as e:  # huggingface_hub raises many types for a missing repo, offline or a network failure
        raise ModelError(f"--pretrained {spec.pretrained}: could not get {repo} from the Hugging Face hub or its "
                         f"local cache ({type(e).__name__}: {one_line(e)[:300]})") from e
    return Path(folder)


def _folder(spec: ModelSpec, model_cache_dir: str | None) -> Path:
    where = spec.pretrained
    if not where:
        raise ModelError(f"model {spec.model_name!r}: --pretrained must name InternVL's Hugging Face folder or "
                         f"repository (huggingface-cli download {HF_REPO} --local-dir InternVL-14B-224px, or "
                         f"--pretrained {HF_REPO})")
    path = Path(where).expanduser()
    if path.is_file() or path.suffix in WEIGHT_SUFFIXES:
        raise ModelError(f"--pretrained {where}: a single weights file (InternVL's .pth) needs InternVL's own "
                         f"repository code, which clipcache does not run; use the Hugging Face folder instead "
                         f"(huggingface-cli download {HF_REPO} --local-dir InternVL-14B-224px, or --pretrained "
                         f"{HF_REPO}; the same InternVL-C head), with --trust_remote_code")
    if (repo := hub_repo(spec)) is not None:
        path = _snapshot(spec, repo, model_cache_dir)
    elif not path.is_dir():
        raise ModelError(f"--pretrained {where}: folder {path} does not exist")
    if not (path / "config.json").is_file():
        raise ModelError(f"--pretrained {where}: {path} has no config.json (not a Hugging Face model folder)")
    return path.resolve()


class InternVLLoader(ModelLoader):
    name = "internvl"
    description = "InternVL-C / InternVL-G (internvl_c_*, internvl_g_*_hf) from a Hugging Face folder; needs " \
                  "--trust_remote_code"
    priority = 30
    runs_remote_code = True

    def claims(self, spec: ModelSpec) -> bool:
        return spec.model_name in MODELS

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        if spec.model_name not in MODELS:
            close = difflib.get_close_matches(spec.model_name, list(MODELS), n=1)
            hint = f". Did you mean: {close[0]}?" if close else ""
            raise ModelError(f"unknown InternVL model {spec.model_name!r} (known: {', '.join(MODELS)}){hint}")
        repo = hub_repo(spec)
        if repo is not None and not spec.trust_remote_code:  # refused before anything is downloaded
            raise ModelError(f"{repo} asks to run its own Python code (InternVL ships its model code in its "
                             f"repository); clipcache runs it only when you trust it: add --trust_remote_code "
                             f"(trust_remote_code: true in a config's model entry)")
        folder = _folder(spec, model_cache_dir)
        if not spec.trust_remote_code:
            raise ModelError(f"{folder} asks to run its own Python code (InternVL ships its model code in the "
                             f"folder); clipcache runs it only when you trust it: add --trust_remote_code "
                             f"(trust_remote_code: true in a config's model entry)")
        local_auto_map(folder)
        code = code_files(folder)
        if not code:
            raise ModelError(f"--pretrained {folder}: no Python model code in the folder (InternVL's folder has "
                             f"modeling_internvl.py beside config.json)")
        head, image_rule = MODELS[spec.model_name]
        checkpoint, label = dir_checkpoint(folder, memo)
        if repo is not None:  # a hub snapshot's folder is its commit: named by the repository, as a downloaded folder
            label = f"{repo.rsplit('/', 1)[-1]}@{label.rsplit('@', 1)[-1]}"
        identity: dict[str, Any] = {
            "loader": self.name, "library": f"transformers {library_version('transformers')}",
            "content": checkpoint[len("sha256:"):], "mode": head, "image_rule": image_rule, "text_preprocessing": TEXT,
            "trust_remote_code": True, "code_files": code}
        return ResolvedModel(self.name, str(folder), str(folder), folder.name if repo else None, identity,
                             f"{checkpoint}+remote-code:{digest(code)[:16]}", label)

    def load(self, resolved: ResolvedModel, device: torch.device, amp: bool,
             cache_dir: str | None) -> EmbeddingModel:
        from clipcache.tasks.models.internvl_model import InternVLClipModel

        return InternVLClipModel(resolved, device, amp)

    def known_names(self) -> list[str]:
        return list(MODELS)


LOADER = InternVLLoader()
