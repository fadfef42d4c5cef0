"""Fetch hosted CLIP-benchmark datasets (webdataset layout) from Hugging Face or ModelScope into the cache.

Files are fetched with each hub's own client: ``huggingface_hub.hf_hub_download`` and ModelScope's
``dataset_file_download``. They bring what a hand-written HTTP loop would have to copy: tokens (``HF_TOKEN`` /
``MODELSCOPE_API_TOKEN`` or a saved login), retries with back-off, resuming a partial file with a Range request,
mirrors through ``HF_ENDPOINT`` / ``MODELSCOPE_ENDPOINT``, and per-file locks, so parallel runs share a download.

Repositories are ``clip-benchmark/wds_<name>`` (revision ``main`` on Hugging Face, ``master`` on ModelScope). Files
land in ``<cache_dir>/datasets/<hub>/wds_<name>/`` with the same relative paths. After a Hugging Face download, a
``.tar`` shard whose hub etag is a SHA-256 (LFS files) is checked against it; a mismatch removes the file and names
it. ``offline=True`` uses only what is already there. Shards are fetched in parallel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipcache.storage.errors import DatasetError
from clipcache.tasks.progress import StageProgress

DEFAULT_ENDPOINTS = {"huggingface": "https://huggingface.co", "modelscope": "https://www.modelscope.cn"}
ENDPOINT_VARIABLES = {"huggingface": "HF_ENDPOINT", "modelscope": "MODELSCOPE_ENDPOINT"}
REVISIONS = {"huggingface": "main", "modelscope": "master"}
OPTIONAL = ("classnames.txt", "zeroshot_classification_templates.txt", "dataset_type.txt")
# Split names the hosted datasets use; probed (by their small nshards.txt) to say which exist when one is missing.
COMMON_SPLITS = ("train", "test", "val", "validation", "valid", "dev")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


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

    @property
    def revision(self) -> str:
        return REVISIONS[self.hub]

    def url(self, path: str) -> str:
        """Where the hub serves ``path`` (Hugging Face's resolve URL; ModelScope's file API)."""
        if self.hub == "modelscope":
            return f"{self.endpoint}/api/v1/datasets/{self.repo}/repo?Revision={self.revision}&FilePath={path}"
        return f"{self.endpoint}/datasets/{self.repo}/resolve/{self.revision}/{path}"

    def local_root(self, cache_dir: str | Path) -> Path:
        return Path(cache_dir) / "datasets" / self.hub / self.repo.split("/")[-1]


class NotFound(Exception):
    pass


def _silent_tqdm() -> Any:
    from tqdm.auto import tqdm

    class Silent(tqdm):  # our own StageProgress counts shards
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


def _from_huggingface(source: HubDataset, path: str, root: Path) -> None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        hf_hub_download(source.repo, path, repo_type="dataset", revision=source.revision, local_dir=root,
                        endpoint=source.endpoint, tqdm_class=_silent_tqdm())
        etag = ""
        if path.endswith(".tar"):
            url = hf_hub_url(source.repo, path, repo_type="dataset", revision=source.revision,
                             endpoint=source.endpoint)
            etag = (get_hf_file_metadata(url).etag or "").strip('"').lower()
    except LocalEntryNotFoundError as e:  # the hub could not be reached (after the client's retries)
        raise DatasetError(f"download of {source.url(path)} failed: {_reason(e)}; run again to resume") from e
    except (RemoteEntryNotFoundError, RepositoryNotFoundError):
        raise NotFound(source.url(path)) from None
    except (HfHubHTTPError, OSError) as e:
        raise DatasetError(f"download of {source.url(path)} failed: {_reason(e)}; run again to resume") from e
    if SHA256.match(etag):
        file = root / path
        with open(file, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != etag:
            file.unlink()
            raise DatasetError(f"download of {source.url(path)} is corrupt: sha256 {digest} but the hub says {etag}; "
                               "removed, run again to fetch it anew")


def _from_modelscope(source: HubDataset, path: str, root: Path) -> None:
    import requests
    from modelscope.hub.file_download import dataset_file_download

    try:
        dataset_file_download(source.repo, path, local_dir=str(root), revision=source.revision,
                              endpoint=source.endpoint)
    except requests.HTTPError as e:
        status = getattr(e.response, "status_code", None)
        if status == 404 or "[404]" in str(e):
            raise NotFound(source.url(path)) from None
        raise DatasetError(f"download of {source.url(path)} failed: {_reason(e)}; run again to resume") from e
    except (requests.RequestException, OSError) as e:
        raise DatasetError(f"download of {source.url(path)} failed: {_reason(e)}; run again to resume") from e
    except Exception as e:  # noqa: BLE001 - modelscope_hub's own HubError family; name it in one line
        if type(e).__module__.startswith(("modelscope", "modelscope_hub")):
            raise DatasetError(f"download of {source.url(path)} failed: {_reason(e)}; run again to resume") from e
        raise


def _reason(error: BaseException) -> str:
    """The first line of the root cause of a client library's error (e.g. 'offline mode is enabled', 'Connection
    refused'), without its request dump."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _download(source: HubDataset, path: str, root: Path) -> None:
    """Put the hub's ``path`` at ``root/path``; NotFound if the hub has no such file."""
    (_from_modelscope if source.hub == "modelscope" else _from_huggingface)(source, path, root)


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
    root.mkdir(parents=True, exist_ok=True)
    for path in OPTIONAL:
        if not (root / path).exists():
            try:
                _download(source, path, root)
            except NotFound:
                pass  # optional: retrieval datasets have no class names, most have no dataset_type.txt
    if not nshards_path.exists():
        try:
            _download(source, f"{split}/nshards.txt", root)
        except NotFound:
            found = [s for s in COMMON_SPLITS if s != split and _exists(source, f"{s}/nshards.txt", root)]
            raise DatasetError(f"dataset {name!r} has no split {split!r} on {hub}; available splits: "
                               f"{', '.join(found) or 'none of ' + ', '.join(COMMON_SPLITS)}") from None
    nshards = int(nshards_path.read_text().strip())
    missing = [i for i in range(nshards) if not (root / split / f"{i}.tar").exists()]
    progress = progress or StageProgress(enabled=False)
    with progress.track(f"download {name}/{split}", nshards, "shard") as advance:
        advance(nshards - len(missing))

        def one(i: int) -> None:
            try:
                _download(source, f"{split}/{i}.tar", root)
            except NotFound as e:
                raise DatasetError(f"dataset {name!r}: shard {split}/{i}.tar not found on {hub} ({e})") from None
            advance(1)

        with ThreadPoolExecutor(max(1, workers)) as pool:
            list(pool.map(one, missing))
    (root / split / ".complete.json").write_text(json.dumps({"hub": hub, "repo": source.repo, "shards": nshards}))
    return root


def _exists(source: HubDataset, path: str, root: Path) -> bool:
    """Whether the hub has ``path`` (a split's tiny nshards.txt: fetched, since it is wanted if that split is used)."""
    try:
        _download(source, path, root)
        return True
    except (NotFound, DatasetError):
        return False
