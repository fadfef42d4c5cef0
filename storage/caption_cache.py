"""Captions from a multimodal LLM, persisted as they arrive.

One append-only JSON-lines file per captioning setup: ``<cache_dir>/captions/<setup key>.jsonl`` where the key is
the digest of (model, api_base, prompt, generation parameters) — never the API key. Each line is
``{"image": <sha256 of the image bytes>, "caption": ...}``, written and flushed as soon as a response arrives, so a
crash or Ctrl-C loses at most the requests in flight. A torn last line (killed mid-write) is ignored on read.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from clipcache.storage import faults
from clipcache.storage.hashing import digest


class CaptionCache:
    def __init__(self, cache_dir: str | Path, setup: dict[str, Any]):
        self.setup = setup
        self.key = digest(setup)
        self.path = Path(cache_dir) / "captions" / f"{self.key}.jsonl"
        self._lock = threading.Lock()
        self._known: dict[str, str] = {}
        if self.path.exists():
            raw = self.path.read_bytes()
            if raw and not raw.endswith(b"\n"):  # end a torn line so the next record starts on its own line
                with open(self.path, "ab") as f:
                    f.write(b"\n")
            for line in raw.decode("utf-8", errors="replace").splitlines():
                try:
                    record = json.loads(line)
                    self._known[record["image"]] = record["caption"]
                except (ValueError, KeyError, TypeError):
                    continue  # a torn line from an interrupted write
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            (self.path.parent / f"{self.key}.setup.json").write_text(json.dumps(setup, indent=1))

    def get(self, image_sha256: str) -> str | None:
        return self._known.get(image_sha256)

    def __len__(self) -> int:
        return len(self._known)

    def put(self, image_sha256: str, caption: str) -> None:
        line = json.dumps({"image": image_sha256, "caption": caption}, ensure_ascii=False) + "\n"
        faults.point("caption")
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
        self._known[image_sha256] = caption
