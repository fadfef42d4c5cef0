"""``glossary_clip``: an open_clip model that reads its texts through a word glossary.

The loader reuses clipcache's open_clip loader for everything about the weights (names, ``--pretrained`` tags and
files, ``local-dir:`` folders, the bundled ``tiny-shapes-clip``) and changes one thing: texts are rewritten word by
word with ``glossary_ja_en.json`` before open_clip tokenises them. Because that changes every text vector, the
glossary's content is part of the model's identity (so its embeddings never share a cache entry with the plain
open_clip model's) and of its checkpoint (so its results are a different experiment from the plain model's).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

from clipcache.storage.hashing import FileHashMemo, digest
from clipcache.tasks.models.loader import ModelLoader, ResolvedModel
from clipcache.tasks.models.spec import ModelSpec

GLOSSARY = Path(__file__).with_name("glossary_ja_en.json")


@cache
def glossary() -> dict[str, str]:
    entries = json.loads(GLOSSARY.read_text(encoding="utf-8"))
    return {k: v for k, v in entries.items() if not k.startswith("_")}


@cache
def _longest_first() -> list[str]:
    return sorted(glossary(), key=len, reverse=True)


def translate(text: str) -> str:
    """Replace glossary entries (longest first, left to right); other characters stay; spaces are normalised."""
    words, keys = glossary(), _longest_first()
    pieces, i = [], 0
    while i < len(text):
        key = next((k for k in keys if text.startswith(k, i)), None)
        if key is None:
            pieces.append(text[i])
            i += 1
        else:
            pieces.append(f" {words[key]} ")
            i += len(key)
    return " ".join("".join(pieces).split())


class GlossaryClipLoader(ModelLoader):
    name = "glossary_clip"
    description = "example plugin: an open_clip model reading texts through a Japanese -> English word glossary"
    priority = 1000  # asked last by `--model_type auto`, and it claims nothing: use it by name

    def claims(self, spec: ModelSpec) -> bool:
        return False

    def resolve(self, spec: ModelSpec, memo: FileHashMemo, model_cache_dir: str | None) -> ResolvedModel:
        from clipcache.tasks.models.open_clip_loader import LOADER as OPEN_CLIP

        weights = OPEN_CLIP.resolve(spec, memo, model_cache_dir)
        content = digest(glossary())
        identity = {**weights.identity, "loader": self.name, "glossary": content}
        label = "+".join(filter(None, [weights.checkpoint_label, "glossary-ja-en"]))
        return dataclasses.replace(weights, loader=self.name, identity=identity, checkpoint_label=label,
                                   checkpoint=f"{weights.checkpoint}+glossary:{content[:16]}")

    def load(self, resolved, device, amp, cache_dir):
        from clipcache_plugin_example.model import GlossaryClipModel  # torch and open_clip only now

        return GlossaryClipModel(resolved, device, amp, cache_dir)
