"""Fetch hosted CLIP-benchmark datasets (webdataset layout) from Hugging Face or ModelScope into the cache.

URL layouts (``{endpoint}`` from ``HF_ENDPOINT`` / ``MODELSCOPE_ENDPOINT``, full base URLs, so mirrors work)::

    Hugging Face: {endpoint}/datasets/clip-benchmark/wds_<name>/resolve/main/<path>
    ModelScope:   {endpoint}/datasets/clip-benchmark/wds_<name>/resolve/master/<path>

Files land in ``<cache_dir>/datasets/<hub>/wds_<name>/`` with the same relative paths. Each file is downloaded to
``<file>.part`` and renamed when complete; an interrupted transfer resumes with an HTTP Range request. Sizes are
checked against Content-Length, and SHA-256 against the hub's LFS etag when it gives one (``X-Linked-Etag``).
``offline=True`` uses only what is already there. Shards are fetched in parallel.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clipcache.storage.errors import DatasetError
from clipcache.tasks.progress import StageProgress

DEFAULT_ENDPOINTS = {"huggingface": "https://huggingface.co", "modelscope": "https://www.modelscope.cn"}
ENDPOINT_VARIABLES = {"huggingface": "HF_ENDPOINT", "modelscope": "MODELSCOPE_ENDPOINT"}
REVISIONS = {"huggingface": "main", "modelscope": "master"}
OPTIONAL = ("classnames.txt", "zeroshot_classification_templates.txt", "dataset_type.txt")
# Split names the hosted datasets use; probed (by their small nshards.txt) to say which exist when one is missing.
COMMON_SPLITS = ("train", "test", "val", "validation", "valid", "dev")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


def repo_name(name: str) -> str:
    """``vtab_cifar10`` / ``vtab/cifar10`` -> ``wds_vtab-cifar10`` (clip_benchmark's naming on the hubs)."""
    bare = name[len("wds/"):] if name.startswith("wds/") else name
    if bare.startswith("vtab_"):
        bare = "vtab/" + bare[len("vtab_"):]
    return "wds_" + bare.replace("/", "-")


@dataclass(frozen=True)
class HubDataset:
    hub: str
    repo: str  # e.g. clip-benchmark/wds_vtab-cifar10

    @property
    def endpoint(self) -> str:
        return os.environ.get(ENDPOINT_VARIABLES[self.hub], DEFAULT_ENDPOINTS[self.hub]).rstrip("/")

    def url(self, path: str) -> str:
        return f"{self.endpoint}/datasets/{self.repo}/resolve/{REVISIONS[self.hub]}/{path}"

    def local_root(self, cache_dir: str | Path) -> Path:
        return Path(cache_dir) / "datasets" / self.hub / self.repo.split("/")[-1]


class NotFound(Exception):
    pass


def _fetch(url: str, target: Path, timeout: float = 60.0) -> None:
    """Download ``url`` to ``target`` via ``target.part``, resuming a partial file, verifying size and sha256."""
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - http(s) endpoints only
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise NotFound(url) from e
        if e.code == 416 and have:  # nothing left to fetch: the part file is complete
            part.rename(target)
            return
        raise DatasetError(f"download of {url} failed: HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise DatasetError(f"download of {url} failed: {getattr(e, 'reason', e)}") from e
    with response:
        if have and response.status != 206:
            have = 0  # the server ignored the Range header: start over
        length = response.headers.get("Content-Length")
        expected = have + int(length) if length is not None else None
        etag = (response.headers.get("X-Linked-Etag") or response.headers.get("ETag") or "").strip('"').lower()
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(part, "ab" if have else "wb") as out:
                while block := response.read(CHUNK):
                    out.write(block)
        except (OSError, TimeoutError, http.client.HTTPException) as e:
            raise DatasetError(f"download of {url} was interrupted after {part.stat().st_size} bytes "
                               f"({type(e).__name__}); run again to resume") from e
    size = part.stat().st_size
    if expected is not None and size != expected:
        raise DatasetError(f"download of {url} is incomplete: {size} of {expected} bytes; run again to resume")
    if SHA256.match(etag):
        digest = hashlib.sha256()
        with open(part, "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
        if digest.hexdigest() != etag:
            part.unlink()
            raise DatasetError(f"download of {url} is corrupt: sha256 {digest.hexdigest()} but the hub says {etag}")
    part.rename(target)


def _exists(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30):  # noqa: S310
            return True
    except (urllib.error.URLError, TimeoutError, OSError):
        return False


def fetch_dataset(name: str, split: str, hub: str, cache_dir: str | Path, *, offline: bool = False, workers: int = 4,
                  progress: StageProgress | None = None) -> Path:
    """Make ``<cache>/datasets/<hub>/wds_<name>`` hold the metadata and the ``split``'s shards; return that folder."""
    source = HubDataset(hub, f"clip-benchmark/{repo_name(name)}")
    root = source.local_root(cache_dir)
    nshards_path = root / split / "nshards.txt"
    if offline:
        if not nshards_path.exists():
            raise DatasetError(f"dataset {name!r} split {split!r} is not in the cache ({root}) and --offline is set")
        return root
    for path in OPTIONAL:
        if not (root / path).exists():
            try:
                _fetch(source.url(path), root / path)
            except NotFound:
                pass  # optional: retrieval datasets have no class names, most have no dataset_type.txt
    if not nshards_path.exists():
        try:
            _fetch(source.url(f"{split}/nshards.txt"), nshards_path)
        except NotFound:
            found = [s for s in COMMON_SPLITS if s != split and _exists(source.url(f"{s}/nshards.txt"))]
            raise DatasetError(f"dataset {name!r} has no split {split!r} on {hub}; available splits: "
                               f"{', '.join(found) or 'none of ' + ', '.join(COMMON_SPLITS)}") from None
    nshards = int(nshards_path.read_text().strip())
    missing = [i for i in range(nshards) if not (root / split / f"{i}.tar").exists()]
    progress = progress or StageProgress(enabled=False)
    with progress.track(f"download {name}/{split}", nshards, "shard") as advance:
        advance(nshards - len(missing))

        def one(i: int) -> None:
            try:
                _fetch(source.url(f"{split}/{i}.tar"), root / split / f"{i}.tar")
            except NotFound as e:
                raise DatasetError(f"dataset {name!r}: shard {split}/{i}.tar not found on {hub} ({e})") from None
            advance(1)

        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(pool.map(one, missing))
    (root / split / ".complete.json").write_text(json.dumps({"hub": hub, "repo": source.repo, "shards": nshards}))
    return root
