"""The Hub download client against a loopback mirror (tests/hub_mirror.py): search, listing,
progress, the HF cache layout, a dropped connection resumed, a cancelled download continued with
a Range request, a damaged transfer refused, HF_HUB_OFFLINE and an unreachable endpoint. The
real Hub is never contacted: every client is given the mirror's URL."""

from __future__ import annotations

import hashlib
import socket
import threading
from pathlib import Path

import pytest
from huggingface_hub import constants

from app.library.hub import (
    ChecksumMismatchError,
    DownloadCancelled,
    HubClient,
    HubError,
    HubOfflineError,
    HubUnreachableError,
    quant_of,
)
from app.library.scan import FolderKind, ModelFolder, find_model_files
from engine.model_summary import summarize_model_file
from tests.hub_mirror import COMMIT, HubMirror

FIXTURES = Path(__file__).parent / "fixtures"
REPO = "tiny-org/Tiny-Gemma3-GGUF"
FILE = "tiny-gemma3-Q4_1.gguf"


@pytest.fixture
def content() -> bytes:
    return (FIXTURES / "tiny_gemma3.gguf").read_bytes()  # ~900 KB, a real model file


@pytest.fixture
def mirror(content):
    with HubMirror() as hub:
        hub.state.repos[REPO] = {FILE: content, "tiny-gemma3-Q8_0.gguf": content[:1000]}
        hub.state.repos["other/Llama-Tiny-GGUF"] = {"llama-tiny-F16.gguf": b"GGUF"}
        hub.state.downloads = {REPO: 10, "other/Llama-Tiny-GGUF": 99}
        yield hub


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # http_get reads this per call; small chunks give several progress calls per file.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)


def client(mirror, tmp_path, **env) -> HubClient:
    return HubClient(env={"HF_ENDPOINT": mirror.url, "HF_HUB_CACHE": str(tmp_path / "hub"), **env})


def test_search_and_list_files(mirror, tmp_path, content):
    hub = client(mirror, tmp_path)
    assert [h.repo_id for h in hub.search("tiny")] == ["other/Llama-Tiny-GGUF", REPO]
    assert [h.repo_id for h in hub.search("gemma3")] == [REPO]
    files = hub.gguf_files(REPO)
    assert [(f.filename, f.size) for f in files] == [
        (FILE, len(content)),
        ("tiny-gemma3-Q8_0.gguf", 1000),
    ]
    assert files[0].sha256 == hashlib.sha256(content).hexdigest()
    assert (
        quant_of(files[0].filename) == "Q4_1"
        and quant_of("x-Q4_K_M-00001-of-00002.gguf") == "Q4_K_M"
    )
    searched = [r for r in mirror.state.requests if r[1] == "/api/models"]
    assert searched, "the search went to the HF_ENDPOINT mirror"
    with pytest.raises(HubError, match="not found"):
        hub.gguf_files("nobody/nothing")


def test_download_into_the_shared_cache_with_progress(mirror, tmp_path, content):
    hub = client(mirror, tmp_path)
    seen: list[tuple[int, int | None]] = []
    path = hub.download(REPO, FILE, progress=lambda done, total: seen.append((done, total)))
    assert path.read_bytes() == content
    sha = hashlib.sha256(content).hexdigest()
    storage = tmp_path / "hub" / "models--tiny-org--Tiny-Gemma3-GGUF"
    assert path == storage / "snapshots" / COMMIT / FILE
    assert path.is_symlink() and path.resolve() == (storage / "blobs" / sha).resolve()
    assert (storage / "refs" / "main").read_text() == COMMIT
    assert len(seen) >= 5 and seen[-1] == (len(content), len(content))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    # The library finds it where other tools look, and it is a runnable model.
    found = find_model_files(
        [ModelFolder(tmp_path / "hub", "Hugging Face cache", FolderKind.HF_CACHE)]
    )
    assert [f.display_name for f in found] == [f"{REPO}/{FILE}"]
    assert summarize_model_file(found[0].path).supported
    # huggingface_hub itself sees the file as cached (other tools share it).
    from huggingface_hub import try_to_load_from_cache

    assert try_to_load_from_cache(REPO, FILE, cache_dir=tmp_path / "hub") == str(path)
    # A second download is served from the cache: no transfer.
    before = mirror.state.body_bytes_sent
    assert hub.download(REPO, FILE) == path and mirror.state.body_bytes_sent == before


def test_dropped_connection_resumes_with_range(mirror, tmp_path, content):
    mirror.state.drop_after = 300_000
    path = client(mirror, tmp_path).download(REPO, FILE)
    assert path.read_bytes() == content
    gets = [r for r in mirror.state.requests if r[0] == "GET" and "/resolve/" in r[1]]
    assert len(gets) == 2 and gets[0][2] is None
    assert gets[1][2] is not None and gets[1][2].startswith("bytes=")
    assert int(gets[1][2][6:-1]) > 0  # continued, not restarted
    # Only what the dropped connection delivered past the last whole chunk is sent twice.
    assert mirror.state.body_bytes_sent < len(content) + 64 * 1024


def test_cancelled_download_continues_next_time(mirror, tmp_path, content):
    hub = client(mirror, tmp_path)
    cancel = threading.Event()

    def progress(done, total):
        if done >= 200_000:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        hub.download(REPO, FILE, progress=progress, cancel=cancel)
    sha = hashlib.sha256(content).hexdigest()
    partial = (
        tmp_path / "hub" / "models--tiny-org--Tiny-Gemma3-GGUF" / "blobs" / f"{sha}.incomplete"
    )
    kept = partial.stat().st_size
    assert 0 < kept < len(content)
    assert hub.cached_path(REPO, FILE) is None
    path = hub.download(REPO, FILE)
    assert path.read_bytes() == content and not partial.exists()
    last = [r for r in mirror.state.requests if r[0] == "GET" and "/resolve/" in r[1]][-1]
    assert last[2] == f"bytes={kept}-"


def test_lfs_redirect_to_a_cdn_like_the_hub(mirror, tmp_path, content):
    mirror.state.redirect_to_cdn = True
    mirror.state.drop_after = 100_000  # and the CDN drops the first connection
    path = client(mirror, tmp_path).download(REPO, FILE)
    assert path.read_bytes() == content
    sha = hashlib.sha256(content).hexdigest()
    assert path.resolve().name == sha  # the blob is named by X-Linked-Etag, not the pointer's ETag
    cdn = [r for r in mirror.state.requests if r[0] == "GET" and r[1].startswith("/cdn/")]
    assert len(cdn) == 2 and cdn[1][2].startswith("bytes=")


def test_damaged_transfer_is_refused(mirror, tmp_path):
    mirror.state.corrupt = True
    hub = client(mirror, tmp_path)
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        hub.download(REPO, FILE)
    storage = tmp_path / "hub" / "models--tiny-org--Tiny-Gemma3-GGUF"
    assert list((storage / "blobs").iterdir()) == []  # neither the blob nor the partial kept
    assert not (storage / "snapshots").exists()


def test_offline_mode_uses_the_cache_only(mirror, tmp_path, content):
    path = client(mirror, tmp_path).download(REPO, FILE)
    count = len(mirror.state.requests)
    offline = client(mirror, tmp_path, HF_HUB_OFFLINE="1")
    with pytest.raises(HubOfflineError, match="HF_HUB_OFFLINE"):
        offline.search("tiny")
    assert offline.download(REPO, FILE) == path
    with pytest.raises(HubOfflineError):
        offline.download(REPO, "tiny-gemma3-Q8_0.gguf")
    assert len(mirror.state.requests) == count  # not one request


def test_unreachable_endpoint_says_so(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    hub = HubClient(env={"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path)})
    with pytest.raises(HubUnreachableError, match=f"Cannot reach http://127.0.0.1:{port}"):
        hub.search("tiny")
    with pytest.raises(HubUnreachableError):
        hub.download(REPO, FILE)


def test_env_is_read_when_the_client_is_made(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    hub = HubClient()
    assert hub.endpoint == "http://127.0.0.1:9" and hub.cache_dir == tmp_path
    monkeypatch.delenv("HF_ENDPOINT")
    assert HubClient().endpoint == "https://huggingface.co"
