"""Texts of API models before they are sent: counted (a named tokenizer or an estimate) and checked against the
longest text the server embeds whole.

- ``--api_tokenizer PATH`` (a ``tokenizer.json``, or a folder holding one: the Hugging Face ``tokenizers`` format,
  which is data, never code) counts each text's tokens as that tokenizer encodes it, special tokens included. Without
  it a text counts ``ceil(characters / 4)`` tokens (OpenAI's rule of thumb), at least 1.
- The longest text: ``--api_max_tokens``, else what the server's model listing (``GET {api_base}/models``) declares
  for the model (``max_model_len`` as vLLM says it, ``max_input_length``, ``context_length``). A longer text stops the
  run in one line naming it (``--api_truncate error``, the default) or is logged and sent (``warn``: the server
  truncates it, and its vector is not that of the whole text). Without a tokenizer only a text whose estimate is over
  twice the maximum is flagged, and only as a warning (the estimate is rough).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clipcache.storage.errors import ConfigError, ModelError

log = logging.getLogger("clipcache.models")
MAX_KEYS = ("max_model_len", "max_input_length", "max_input_tokens", "context_length", "max_seq_length")


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


class TextCounter:
    def __init__(self, settings: Any, label: str):
        self.settings, self.label = settings, label
        self._tokenizer = None
        if settings.tokenizer:
            path = Path(settings.tokenizer).expanduser()
            if path.is_dir():
                path = path / "tokenizer.json"
            if not path.is_file():
                raise ConfigError(f"--api_tokenizer: {path} is not a tokenizer.json file (or a folder holding one)")
            try:
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(path))
            except Exception as e:  # the tokenizers library raises its own Exception subclass for a bad file
                raise ConfigError(f"--api_tokenizer: {path} cannot be read as a tokenizer ({type(e).__name__})") \
                    from None
        self.max_tokens: int | None = settings.max_tokens

    def counts(self, texts: Sequence[str]) -> list[int]:
        if self._tokenizer is None:
            return [estimate_tokens(t) for t in texts]
        return [max(1, len(e.ids)) for e in self._tokenizer.encode_batch(list(texts))]

    def declared_max(self, listing: Any, model_id: str) -> None:
        """Take the server's declared maximum from its model listing's entry for ``model_id`` (if it has one)."""
        if self.max_tokens is not None or not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
            return
        for entry in listing["data"]:
            if isinstance(entry, dict) and entry.get("id") == model_id:
                for key in MAX_KEYS:
                    value = entry.get(key)
                    if type(value) is int and 0 < value < 2 ** 31:
                        self.max_tokens = value
                        return

    def check(self, texts: Sequence[str], counts: Sequence[int], what: str) -> None:
        """Stop (or warn) when a text is longer than the server's declared maximum."""
        if self.max_tokens is None:
            return
        exact = self._tokenizer is not None
        limit = self.max_tokens if exact else 2 * self.max_tokens
        for text, count in zip(texts, counts, strict=True):
            if count <= limit:
                continue
            shown = " ".join(text.split())
            shown = shown[:60] + ("..." if len(shown) > 60 else "")
            message = (f"{self.label}: a text of {what} has {count:,} tokens ({'counted' if exact else 'estimated'}), "
                       f"more than the {self.max_tokens:,} the server embeds whole: {shown!r}")
            if exact and self.settings.truncate == "error":
                raise ModelError(f"{message}; the server would truncate it. Shorten the data, or pass "
                                 f"--api_truncate warn to send it anyway")
            log.warning("%s; sent anyway (the server truncates it)", message)
