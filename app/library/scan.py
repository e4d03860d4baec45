"""Find GGUF files where the user and other local-model tools keep them, and describe each one.

Where the other tools store models (their defaults; each can be moved by the user):
- Hugging Face cache (huggingface_hub, also used by llama.cpp's `-hf`, transformers, LocalChat's
  own downloads): `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
  else `~/.cache/huggingface/hub`, on every platform. Files are `models--org--name/snapshots/
  <commit>/<file>`, symlinks into `blobs/`; only the snapshots are listed (the blobs are the same
  bytes under hash names).
- LM Studio: `~/.lmstudio/models` (0.3 and later, every platform), `~/.cache/lm-studio/models`
  (earlier versions). Layout `publisher/repo/file.gguf`.
- GPT4All: the app's data folder, `~/.local/share/nomic.ai/GPT4All` (Linux, `$XDG_DATA_HOME`),
  `~/Library/Application Support/nomic.ai/GPT4All` (macOS), `%LOCALAPPDATA%\\nomic.ai\\GPT4All`
  (Windows).
- Ollama: `$OLLAMA_MODELS`, else `~/.ollama/models` (and `/usr/share/ollama/.ollama/models` for the
  Linux system service). Weights are `blobs/sha256-<hex>` with no extension; a blob is a model
  when it starts with the GGUF magic. `manifests/<registry>/<namespace>/<model>/<tag>` (JSON)
  names them: the layer of media type `application/vnd.ollama.image.model` is the weights.

Reading is header-only (engine.model_summary), and summaries are remembered per file (path, size,
modification time), so a second scan of an unchanged library reads no file at all.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from engine.model_summary import summarize_model_file
from engine.types import ModelFileSummary

GGUF_MAGIC = b"GGUF"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"


class FolderKind(StrEnum):
    PLAIN = "folder"  # any folder: every *.gguf below it
    HF_CACHE = "hf_cache"  # a huggingface_hub cache: snapshots only
    OLLAMA = "ollama"  # an Ollama models folder: blobs that are GGUF, named by manifests


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    source: str  # shown in the library: "Hugging Face cache", "LM Studio", "Your folder"...
    kind: FolderKind = FolderKind.PLAIN


def hf_hub_cache(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """The Hugging Face hub cache folder as huggingface_hub.constants computes it."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = (
        Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else home / ".cache"
    )
    return cache / "huggingface" / "hub"


def known_model_folders(
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    platform: str | None = None,
) -> list[ModelFolder]:
    """Where other tools keep GGUF files by default on this platform (existing or not)."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    platform = sys.platform if platform is None else platform
    folders = [ModelFolder(hf_hub_cache(env, home), "Hugging Face cache", FolderKind.HF_CACHE)]
    folders.append(ModelFolder(home / ".lmstudio" / "models", "LM Studio"))
    folders.append(ModelFolder(home / ".cache" / "lm-studio" / "models", "LM Studio"))
    if platform == "darwin":
        gpt4all = home / "Library" / "Application Support" / "nomic.ai" / "GPT4All"
    elif platform.startswith("win"):
        local = env.get("LOCALAPPDATA")
        gpt4all = (Path(local) if local else home / "AppData" / "Local") / "nomic.ai" / "GPT4All"
    else:
        data = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else home / ".local" / "share"
        gpt4all = data / "nomic.ai" / "GPT4All"
    folders.append(ModelFolder(gpt4all, "GPT4All"))
    if env.get("OLLAMA_MODELS"):
        folders.append(ModelFolder(Path(env["OLLAMA_MODELS"]), "Ollama", FolderKind.OLLAMA))
    else:
        folders.append(ModelFolder(home / ".ollama" / "models", "Ollama", FolderKind.OLLAMA))
        if platform.startswith("linux"):
            system = Path("/usr/share/ollama/.ollama/models")
            folders.append(ModelFolder(system, "Ollama (system)", FolderKind.OLLAMA))
    return folders


@dataclass(frozen=True)
class FoundFile:
    path: Path
    source: str
    display_name: str


def find_model_files(folders: Iterable[ModelFolder]) -> list[FoundFile]:
    """Every GGUF file in the folders, each real file once (the first folder that has it wins)."""
    seen: set[str] = set()
    found: list[FoundFile] = []
    for folder in folders:
        if not folder.path.is_dir():
            continue
        if folder.kind == FolderKind.HF_CACHE:
            candidates = _hf_cache_files(folder.path)
        elif folder.kind == FolderKind.OLLAMA:
            candidates = _ollama_files(folder.path)
        else:
            candidates = ((p, _relative_name(p, folder.path)) for p in _gguf_files(folder.path))
        for path, display in candidates:
            try:
                key = os.path.realpath(path)
            except OSError:
                key = str(path)
            if key in seen:
                continue
            seen.add(key)
            found.append(FoundFile(path, folder.source, display))
    return found


class LibraryScanner:
    """Scans folders and remembers each file's summary until the file changes. Thread-safe: the
    app scans on a worker thread while the dialog may start another scan."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int, int], ModelFileSummary]] = {}

    def scan(
        self,
        folders: Iterable[ModelFolder],
        *,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> list[ModelFileSummary]:
        summaries = []
        for found in find_model_files(folders):
            if cancelled():
                break
            summaries.append(self.summary(found))
        return summaries

    def summary(self, found: FoundFile) -> ModelFileSummary:
        try:
            st = found.path.stat()
            stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            stamp = None
        key = str(found.path)
        with self._lock:
            cached = self._cache.get(key)
        if stamp is not None and cached is not None and cached[0] == stamp:
            summary = cached[1]
        else:
            summary = summarize_model_file(found.path)
            if stamp is not None:
                with self._lock:
                    self._cache[key] = (stamp, summary)
        return replace(summary, source=found.source, display_name=found.display_name)


# --- the folder layouts ---------------------------------------------------------------------------
def _gguf_files(root: Path) -> Iterator[Path]:
    """*.gguf below root (any letter case), hidden folders skipped, sorted for a stable list."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.lower().endswith(".gguf") and not name.startswith("."):
                path = Path(dirpath) / name
                if path.is_file():  # a dangling symlink is not a model
                    yield path


def _relative_name(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name


def _hf_cache_files(cache: Path) -> Iterator[tuple[Path, str]]:
    for repo_dir in sorted(cache.glob("models--*")):
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/")
        snapshots = repo_dir / "snapshots"
        if not snapshots.is_dir():
            continue
        for path in _gguf_files(snapshots):
            # snapshots/<commit>/<file in repo>: show repo and file, not the commit hash.
            inside = path.relative_to(snapshots).parts[1:]
            yield path, f"{repo_id}/{'/'.join(inside)}"


def _ollama_files(models: Path) -> Iterator[tuple[Path, str]]:
    names = _ollama_names(models / "manifests")
    blobs = models / "blobs"
    if not blobs.is_dir():
        return
    for path in sorted(blobs.iterdir()):
        if not path.name.startswith("sha256") or not path.is_file() or not _starts_with_gguf(path):
            continue
        digest = path.name.replace("-", ":", 1)
        yield path, names.get(digest, path.name)


def _ollama_names(manifests: Path) -> dict[str, str]:
    """Blob digest ("sha256:...") -> "model:tag" from Ollama's manifests (a digest shared by two
    tags keeps the first name in sorted order)."""
    names: dict[str, str] = {}
    if not manifests.is_dir():
        return names
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        parts = manifest.relative_to(manifests).parts  # registry, namespace, model, tag
        if len(parts) < 2:
            continue
        namespace = parts[-3] if len(parts) >= 3 else ""
        model = parts[-2] if namespace in ("library", "") else f"{namespace}/{parts[-2]}"
        for layer in layers if isinstance(layers, list) else []:
            if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
                digest = layer.get("digest")
                if isinstance(digest, str):
                    names.setdefault(digest, f"{model}:{parts[-1]}")
    return names


def _starts_with_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
