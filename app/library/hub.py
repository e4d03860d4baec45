"""GGUF files from the Hugging Face Hub (or a mirror), downloaded into the shared HF cache.

huggingface_hub does the Hub's protocol: search (`GET /api/models?search=&filter=gguf`), a repo's
files with sizes and LFS sha256 (`GET /api/models/<repo>/revision/<rev>?blobs=True`), a file's
commit/etag/size (`HEAD /<repo>/resolve/<rev>/<file>`: X-Repo-Commit, X-Linked-Etag or ETag,
X-Linked-Size) and the transfer itself (`file_download.http_get`: Range requests, retries that
resume a dropped connection within one call). What is ours:

- the partial file survives: `hf_hub_download` (2.x) writes each attempt to a process-unique temp
  file and deletes it, so a cancelled or crashed download starts over. We keep
  `blobs/<etag>.incomplete` (the cache's own name for it) and continue it with a Range request.
- cancel and progress for a GUI: a progress object whose update() reports bytes and raises
  DownloadCancelled when the user stops (http_get calls it after every chunk).
- the checksum: http_get checks only the size. For an LFS file the Hub's etag is the sha256 of
  the content; the finished file is hashed and refused (deleted) when it does not match.

The result is the standard cache layout (blobs/<etag>, snapshots/<commit>/<file> -> blob,
refs/<rev>), so llama.cpp, LM Studio's HF import, transformers and huggingface-cli see the file.
`HF_ENDPOINT` selects a mirror and `HF_HUB_OFFLINE` forbids the network; both are read when a
client is made, not when huggingface_hub was imported.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from app.library.scan import hf_hub_cache

DEFAULT_ENDPOINT = "https://huggingface.co"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HASH_CHUNK = 8 << 20


class HubError(Exception):
    """A Hub operation failed; the message says what and what to do."""


class HubOfflineError(HubError):
    pass


class HubUnreachableError(HubError):
    pass


class ChecksumMismatchError(HubError):
    pass


class DownloadCancelled(HubError):
    pass


@dataclass(frozen=True)
class RepoHit:
    repo_id: str
    downloads: int | None
    likes: int | None


@dataclass(frozen=True)
class RemoteFile:
    repo_id: str
    filename: str
    size: int | None
    sha256: str | None  # LFS files only
    quant: str = ""  # as the file name states it (quant_of)


def quant_of(filename: str) -> str:
    """The quant a GGUF file name states (model-Q4_K_M.gguf -> Q4_K_M), else ""."""
    match = re.search(
        r"(?i)[-_.]((?:I?Q\d(?:_[0-9A-Z]+)*)|F16|F32|BF16|TQ\d_\d)(?:-\d{5}-of-\d{5})?\.gguf$",
        filename,
    )
    return match.group(1).upper() if match else ""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


class HubClient:
    def __init__(
        self,
        *,
        endpoint: str | None = None,
        cache_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
    ):
        env = os.environ if env is None else env
        self.endpoint = (endpoint or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.offline = _truthy(env.get("HF_HUB_OFFLINE")) or _truthy(
            env.get("TRANSFORMERS_OFFLINE")
        )
        self.cache_dir = Path(cache_dir) if cache_dir else hf_hub_cache(env)
        self.api = HfApi(endpoint=self.endpoint)

    # --- browsing ---------------------------------------------------------------------------
    def search(self, query: str, limit: int = 40) -> list[RepoHit]:
        """Model repos with GGUF files whose name contains `query`, most downloaded first."""
        self._require_online()
        # One page by hand rather than HfApi.list_models: its paginator retries a refused
        # connection with backoff for ~23 s before failing, and "not reachable" must be prompt.
        params: dict[str, str | int] = {"filter": "gguf", "sort": "downloads", "limit": limit}
        if query.strip():
            params["search"] = query.strip()
        with self._translated_errors(query):
            response = get_session().get(
                f"{self.endpoint}/api/models", params=params, headers=self._headers(), timeout=20
            )
            hf_raise_for_status(response)
            models = [ModelInfo(**item) for item in response.json()]
        return [RepoHit(m.id, m.downloads, m.likes) for m in models]

    def gguf_files(self, repo_id: str, revision: str = "main") -> list[RemoteFile]:
        self._require_online()
        with self._translated_errors(repo_id):
            info = self.api.model_info(repo_id, revision=revision, files_metadata=True)
        files = []
        for sibling in info.siblings or []:
            if sibling.rfilename.lower().endswith(".gguf"):
                sha = sibling.lfs.sha256 if sibling.lfs else None
                size = sibling.lfs.size if sibling.lfs else sibling.size
                files.append(
                    RemoteFile(repo_id, sibling.rfilename, size, sha, quant_of(sibling.rfilename))
                )
        return sorted(files, key=lambda f: f.filename)

    # --- downloading ------------------------------------------------------------------------
    def cached_path(self, repo_id: str, filename: str, revision: str = "main") -> Path | None:
        """The file in the cache for that revision, if it is there complete."""
        storage = self._storage(repo_id)
        commit = revision
        if not _COMMIT.match(revision):
            ref = storage / "refs" / revision
            if not ref.is_file():
                return None
            commit = ref.read_text().strip()
        pointer = storage / "snapshots" / commit / filename
        return pointer if pointer.is_file() else None

    def download(
        self,
        repo_id: str,
        filename: str,
        *,
        revision: str = "main",
        expected_sha256: str | None = None,
        progress: Callable[[int, int | None], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Path:
        """Download (or continue downloading) one file into the cache; its snapshot path.

        progress(done_bytes, total_bytes) is called from this thread as bytes arrive."""
        if self.offline:
            cached = self.cached_path(repo_id, filename, revision)
            if cached is not None:
                return cached
        self._require_online()
        cancel = cancel or threading.Event()
        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        with self._translated_errors(f"{repo_id}/{filename}"):
            meta = get_hf_file_metadata(url, endpoint=self.endpoint, headers=self._headers())
        if not meta.commit_hash or not meta.etag:
            raise HubError(
                f"{self.endpoint} did not say which commit and version {filename} is (no "
                f"X-Repo-Commit or ETag header): not a Hugging Face Hub or mirror?"
            )
        storage = self._storage(repo_id)
        blob = storage / "blobs" / meta.etag
        pointer = storage / "snapshots" / meta.commit_hash / filename
        expected = expected_sha256 or (meta.etag if _SHA256.match(meta.etag) else None)
        if not blob.is_file():
            self._fetch_blob(meta, blob, expected, progress, cancel, filename)
        elif progress is not None:
            progress(blob.stat().st_size, blob.stat().st_size)
        _link(blob, pointer)
        if revision != meta.commit_hash:
            ref = storage / "refs" / revision
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(meta.commit_hash)
        return pointer

    def _fetch_blob(self, meta, blob: Path, expected: str | None, progress, cancel, filename):
        blob.parent.mkdir(parents=True, exist_ok=True)
        partial = blob.with_name(blob.name + ".incomplete")
        resume = partial.stat().st_size if partial.exists() else 0
        if meta.size is not None and resume > meta.size:  # not the same file: start over
            partial.unlink()
            resume = 0
        if meta.size is not None:
            free = shutil.disk_usage(blob.parent).free
            if free < meta.size - resume:
                raise HubError(
                    f"not enough disk space for {filename}: {meta.size - resume:,} bytes needed, "
                    f"{free:,} free in {blob.parent}"
                )
        reporter = _progress_class(progress, cancel)
        with self._translated_errors(filename), open(partial, "ab") as out:
            http_get(
                meta.location,
                out,
                resume_size=resume,
                headers=self._headers(),
                expected_size=meta.size,
                displayed_filename=filename,
                tqdm_class=reporter,  # type: ignore[arg-type]
            )
        if expected is not None:
            actual = _sha256_of(partial, cancel)
            if actual != expected:
                partial.unlink()
                raise ChecksumMismatchError(
                    f"{filename} arrived damaged: its sha256 is {actual}, the Hub says "
                    f"{expected}. The file was deleted; download it again."
                )
        os.replace(partial, blob)

    # --- helpers ----------------------------------------------------------------------------
    def _storage(self, repo_id: str) -> Path:
        return self.cache_dir / f"models--{repo_id.replace('/', '--')}"

    def _headers(self) -> dict[str, str]:
        return build_hf_headers(library_name="LocalChat")

    def _require_online(self) -> None:
        if self.offline:
            raise HubOfflineError(
                "HF_HUB_OFFLINE is set: LocalChat does not contact the Hugging Face Hub. "
                "Unset it to search and download; files already in the cache are listed."
            )

    def _translated_errors(self, what: str):
        return _Translate(self.endpoint, what)


class _Translate:
    """Turns huggingface_hub / httpx failures into HubError messages a user can act on."""

    def __init__(self, endpoint: str, what: str):
        self.endpoint, self.what = endpoint, what

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, HubError):
            return False
        if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError)):
            raise HubUnreachableError(
                f"Cannot reach {self.endpoint} ({type(exc).__name__}: {exc}). Check the network "
                f"connection{' or the HF_ENDPOINT mirror' if self.endpoint != DEFAULT_ENDPOINT else ''}."
            ) from exc
        if isinstance(exc, GatedRepoError):
            raise HubError(
                f"{self.what} is gated: accept its terms on the Hub and log in with `hf auth login`."
            ) from exc
        if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError)):
            raise HubError(f"{self.what} was not found on {self.endpoint}.") from exc
        if isinstance(exc, HfHubHTTPError):
            raise HubError(f"{self.endpoint} refused {self.what}: {exc}") from exc
        if isinstance(exc, httpx2.HTTPError):
            raise HubUnreachableError(f"The transfer from {self.endpoint} failed: {exc}") from exc
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            raise HubError(f"{self.what}: {exc}") from exc
        return False


def _progress_class(progress: Callable[[int, int | None], None] | None, cancel: threading.Event):
    """A tqdm stand-in for http_get: reports bytes, raises DownloadCancelled when asked to stop."""

    class Reporter:
        def __init__(self, *args, total=None, initial=0, **kwargs):
            self.total, self.n = total, initial
            if progress is not None:
                progress(self.n, self.total)

        def update(self, n: int = 1) -> None:
            self.n += n
            if progress is not None:
                progress(self.n, self.total)
            if cancel.is_set():
                raise DownloadCancelled("Download stopped; it continues from here next time.")

        def close(self) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    return Reporter


def _sha256_of(path: Path, cancel: threading.Event) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            if cancel.is_set():
                raise DownloadCancelled("Stopped while checking the download.")
            digest.update(chunk)
    return digest.hexdigest()


def _link(blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<file> -> ../../blobs/<etag>, as huggingface_hub lays it out (a copy
    where symlinks are not allowed, e.g. Windows without developer mode)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:
        shutil.copy2(blob, pointer)
