"""The model library's scan: real files, the other tools' folder layouts, broken files, 50 copies.

Golden facts come from gguf-py's GGUFReader (an independent parser) for the tiny fixtures and
from the model cards for the packaged models (SmolLM2-135M: llama, 8192 context, ChatML template).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from app.library.scan import (
    FolderKind,
    LibraryScanner,
    ModelFolder,
    find_model_files,
    hf_hub_cache,
    known_model_folders,
)
from engine.gguf import UnreadStrings, open_gguf
from engine.model_summary import summarize_model_file

FIXTURES = Path(__file__).parent / "fixtures"
TINY = sorted(FIXTURES.glob("tiny_*.gguf"))


def _reader_facts(path: Path) -> dict:
    reader = GGUFReader(path)
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    ctx_field = reader.fields.get(f"{arch}.context_length")
    return {
        "architecture": arch,
        "parameters": sum(int(np.prod(t.shape)) for t in reader.tensors),
        "context_length": int(ctx_field.parts[ctx_field.data[0]][0]) if ctx_field else None,
        "types": {t.tensor_type.name for t in reader.tensors},
        "template": "tokenizer.chat_template" in reader.fields,
    }


@pytest.mark.parametrize("path", TINY[:6], ids=lambda p: p.stem)
def test_summary_matches_gguf_py(path):
    facts = _reader_facts(path)
    s = summarize_model_file(path)
    assert s.error is None and s.supported, s
    assert s.architecture == facts["architecture"]
    assert s.parameters == facts["parameters"]
    assert s.context_length == facts["context_length"]
    assert {name for name, _, _ in s.quant_mix} == facts["types"]
    assert s.has_chat_template == facts["template"]
    assert s.size == path.stat().st_size


def test_real_models_described(smollm2_path, gemma3_path):
    smol = summarize_model_file(smollm2_path)
    assert (smol.architecture, smol.context_length, smol.quant) == ("llama", 8192, "Q4_1")
    assert smol.has_chat_template and smol.supported
    assert 134_000_000 < smol.parameters < 136_000_000  # "135M"
    gemma = summarize_model_file(gemma3_path)
    assert (gemma.architecture, gemma.quant, gemma.context_length) == ("gemma3", "Q4_K_M", 32768)
    assert gemma.supported


def test_skipped_vocabulary_keeps_its_length(smollm2_path):
    full = open_gguf(smollm2_path)
    quick = open_gguf(smollm2_path, skip_string_arrays=True)
    tokens = quick.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, UnreadStrings)
    assert len(tokens) == len(full.metadata["tokenizer.ggml.tokens"]) == 49152
    # Everything after the skipped arrays is read at the same offsets.
    assert quick.data_offset == full.data_offset
    assert quick.tensor_offsets == full.tensor_offsets


def test_truncated_vocabulary_is_an_error_not_a_crash(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as src:
        cut.write_bytes(src.read(400_000))  # inside the vocabulary
    s = summarize_model_file(cut)
    assert s.error and "truncated or corrupt" in s.error, s


def test_broken_and_unsupported_files_are_listed(tmp_path):
    good = tmp_path / "good.gguf"
    shutil.copy(TINY[0], good)
    (tmp_path / "notes.gguf").write_text("not a model, just some notes typed by hand")
    (tmp_path / "empty.gguf").write_bytes(b"")
    data = TINY[0].read_bytes()
    (tmp_path / "half.gguf").write_bytes(data[: len(data) // 3])
    # An unsupported architecture: same file with general.architecture renamed in place.
    arch = summarize_model_file(TINY[0]).architecture
    (tmp_path / "alien.gguf").write_bytes(data.replace(arch.encode(), b"x" * len(arch), 1))
    summaries = {Path(s.path).name: s for s in LibraryScanner().scan([ModelFolder(tmp_path, "t")])}
    assert set(summaries) == {"good.gguf", "notes.gguf", "empty.gguf", "half.gguf", "alien.gguf"}
    assert summaries["good.gguf"].supported and summaries["good.gguf"].error is None
    assert "not a GGUF file" in summaries["notes.gguf"].error
    assert "empty" in summaries["empty.gguf"].error
    assert summaries["half.gguf"].error
    alien = summaries["alien.gguf"]
    assert alien.error is None and not alien.supported
    assert "not supported" in alien.unsupported_reason


def test_fifty_copies_are_all_listed(tmp_path, smollm2_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(25):  # hard links: 50 names, each a file of its own for the scanner
        _link_or_copy(TINY[i % len(TINY)], folder / f"tiny-{i:02}.gguf")
        _link_or_copy(smollm2_path, folder / f"smol-{i:02}.gguf")
    # A symlink to a file already listed is the same model: listed once.
    (folder / "zz-alias.gguf").symlink_to(folder / "smol-00.gguf")
    scanner = LibraryScanner()
    summaries = scanner.scan([ModelFolder(folder, "mine")])
    assert len(summaries) == 50
    assert all(s.error is None and s.supported for s in summaries)
    assert sum(s.name and "Smollm2" in s.name and s.has_chat_template for s in summaries) == 25
    # Second scan: served from the cache, same answer.
    assert scanner.scan([ModelFolder(folder, "mine")]) == summaries


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        shutil.copy(src, dst)


def test_cache_notices_a_changed_file(tmp_path):
    path = tmp_path / "m.gguf"
    shutil.copy(TINY[0], path)
    scanner = LibraryScanner()
    first = scanner.scan([ModelFolder(tmp_path, "t")])[0]
    path.write_bytes(b"garbage-now")
    second = scanner.scan([ModelFolder(tmp_path, "t")])[0]
    assert first.error is None and second.error is not None


def _hf_cache(root: Path, repo: str, files: dict[str, Path]) -> Path:
    """A huggingface_hub cache layout: blobs by hash, snapshot symlinks, a ref."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    commit = "a" * 40
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo_dir / "blobs").mkdir()
    for i, (name, src) in enumerate(files.items()):
        blob = repo_dir / "blobs" / f"{i:064x}"
        shutil.copy(src, blob)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
    (snap / "README.md").write_text("card")
    return repo_dir


def test_hf_cache_lists_snapshots_once_with_repo_names(tmp_path):
    _hf_cache(tmp_path, "org/tiny-GGUF", {"tiny-Q4_0.gguf": TINY[0], "sub/tiny-Q8.gguf": TINY[1]})
    found = find_model_files([ModelFolder(tmp_path, "Hugging Face cache", FolderKind.HF_CACHE)])
    assert sorted(f.display_name for f in found) == [
        "org/tiny-GGUF/sub/tiny-Q8.gguf",
        "org/tiny-GGUF/tiny-Q4_0.gguf",
    ]
    # Blobs are not listed a second time, even when the cache is also scanned as a plain folder.
    both = find_model_files(
        [ModelFolder(tmp_path, "hf", FolderKind.HF_CACHE), ModelFolder(tmp_path, "plain")]
    )
    assert len(both) == 2


def test_ollama_blobs_named_from_manifests(tmp_path):
    models = tmp_path / "models"
    (models / "blobs").mkdir(parents=True)
    digest = "sha256:" + "b" * 64
    shutil.copy(TINY[0], models / "blobs" / digest.replace(":", "-"))
    (models / "blobs" / ("sha256-" + "c" * 64)).write_text('{"temperature": 0.7}')  # params
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "q4"
    manifest.parent.mkdir(parents=True)
    layers = [{"mediaType": "application/vnd.ollama.image.model", "digest": digest}]
    manifest.write_text(json.dumps({"layers": layers}))
    found = find_model_files([ModelFolder(models, "Ollama", FolderKind.OLLAMA)])
    assert [f.display_name for f in found] == ["tiny:q4"]
    assert summarize_model_file(found[0].path).supported


def test_known_folders_per_platform(tmp_path):
    home = tmp_path
    linux = {f.source: f.path for f in known_model_folders({}, home, "linux")}
    assert linux["Hugging Face cache"] == home / ".cache" / "huggingface" / "hub"
    assert linux["GPT4All"] == home / ".local" / "share" / "nomic.ai" / "GPT4All"
    assert linux["Ollama"] == home / ".ollama" / "models"
    mac = {f.source: f.path for f in known_model_folders({}, home, "darwin")}
    assert mac["GPT4All"] == home / "Library" / "Application Support" / "nomic.ai" / "GPT4All"
    win = {f.source: f.path for f in known_model_folders({"LOCALAPPDATA": "C:/L"}, home, "win32")}
    assert win["GPT4All"] == Path("C:/L") / "nomic.ai" / "GPT4All"
    lm = [f.path for f in known_model_folders({}, home, "linux") if f.source == "LM Studio"]
    assert lm == [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    env = {"OLLAMA_MODELS": "/srv/ollama", "HF_HUB_CACHE": "/srv/hf"}
    moved = {f.source: f.path for f in known_model_folders(env, home, "linux")}
    assert moved["Ollama"] == Path("/srv/ollama") and moved["Hugging Face cache"] == Path("/srv/hf")


def test_hf_cache_env_order(tmp_path):
    assert hf_hub_cache({"HF_HOME": "/h"}, tmp_path) == Path("/h/hub")
    assert hf_hub_cache({"XDG_CACHE_HOME": "/x"}, tmp_path) == Path("/x/huggingface/hub")
    assert hf_hub_cache({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}, tmp_path) == Path("/c")


def test_split_model_parts_say_so(tmp_path):
    # A part whose header reads (here a whole tiny model under a gguf-split name) is listed as
    # not runnable with the reason; a later part without general.architecture likewise, as an
    # unreadable file that says what it is.
    first = tmp_path / "model-00001-of-00002.gguf"
    shutil.copy(TINY[0], first)
    (tmp_path / "model-00002-of-00002.gguf").write_bytes(TINY[0].read_bytes()[:2000])
    rows = {Path(s.path).name: s for s in LibraryScanner().scan([ModelFolder(tmp_path, "t")])}
    one = rows["model-00001-of-00002.gguf"]
    assert one.error is None and not one.supported
    assert "part 1 of 2 of a split model" in one.unsupported_reason
    two = rows["model-00002-of-00002.gguf"]
    assert "part 2 of 2 of a split model" in two.error
    # An ordinary name is not taken for a part.
    assert summarize_model_file(TINY[0]).supported
