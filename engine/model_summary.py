"""Describe a GGUF file from its header alone, fast enough to list a folder of models.

`python -m engine info` (engine/__main__.py model_info) builds the tokenizer and resolves presets
too; a library listing cannot pay that (SmolLM2's tokenizer alone is ~100 ms). Here the header is
walked without decoding the vocabulary (open_gguf(skip_string_arrays=True)) and the model config
is checked exactly as the loader checks it, so "supported" means what a load would say about the
architecture, tensor types and shapes. A file that is not a readable GGUF gives a summary with
`error` set instead of an exception: one broken file must not break a listing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gguf import LlamaFileType

from engine.config import ModelConfig
from engine.errors import EngineError, UnsupportedModelError
from engine.gguf import GGUFFile, open_gguf
from engine.types import ModelFileSummary

# llama.cpp's gguf-split names: model-00001-of-00003.gguf
_SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)

# Words in a model's name or fine-tune label that mark a chat/instruction tune (gemma-3-270m-it,
# SmolLM2-135M-Instruct, ...-chat, ...-SFT, ...-DPO): whole words only, so "it" does not match
# inside "Smith" nor "chat" inside "chatty".
_INSTRUCT_WORDS = frozenset({"instruct", "instruction", "chat", "it", "sft", "dpo", "rlhf", "orpo"})
_NAME_KEYS = ("general.finetune", "general.name", "general.basename")


def is_base_model(metadata) -> bool:
    """Whether the file is a base (pretrained-only) model: no chat template of its own and no
    instruct marker in its name or fine-tune label. Such a model continues text; in a chat it
    is given a fallback template it was never trained on (engine/chat_template.py) and tends to
    repeat the question instead of answering. A file with a template is a chat model whatever
    its name; a template-less file named "...-Instruct" lost its template in conversion and is
    still an instruct model."""
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        return False
    for key in _NAME_KEYS:
        value = metadata.get(key)
        if isinstance(value, str):
            words = re.split(r"[^0-9a-z]+", value.lower())
            if _INSTRUCT_WORDS.intersection(words):
                return False
    return True


def split_part(path: Path, metadata: dict | None = None) -> tuple[int, int] | None:
    """(part, parts) for one file of a model split by gguf-split, from its split.* keys or its
    name; None for a whole model."""
    if metadata is not None and isinstance(metadata.get("split.count"), int):
        count = metadata["split.count"]
        if count > 1:
            return int(metadata.get("split.no", 0)) + 1, count
        return None
    match = _SPLIT_NAME.search(path.name)
    if match and int(match.group(2)) > 1:
        return int(match.group(1)), int(match.group(2))
    return None


def _split_reason(part: tuple[int, int]) -> str:
    return (
        f"part {part[0]} of {part[1]} of a split model; this engine loads single-file GGUF "
        f"models (join the parts with `llama-gguf-split --merge`)"
    )


def summarize_model_file(
    path: str | os.PathLike[str], *, source: str = "", display_name: str = ""
) -> ModelFileSummary:
    """The library's facts about one file; never raises for a bad file (see `error`)."""
    path = Path(path)
    shown = display_name or path.name
    try:
        size = path.stat().st_size
    except OSError as exc:
        return ModelFileSummary(str(path), 0, source, shown, error=f"cannot read: {exc.strerror}")
    reason: str | None = None
    try:
        try:
            gguf_file = open_gguf(path, skip_string_arrays=True)
        except UnsupportedModelError as exc:
            reason = _without_path(exc, path)
            gguf_file = open_gguf(path, skip_unsupported_types=True, skip_string_arrays=True)
        config = None
        part = split_part(path, gguf_file.metadata)
        if part is not None:  # each part holds a share of the tensors: "missing tensor" is noise
            reason = _split_reason(part)
        if reason is None:
            try:
                config = ModelConfig.from_gguf(gguf_file)
            except UnsupportedModelError as exc:
                reason = _without_path(exc, path)
    except EngineError as exc:  # not a GGUF, truncated, a key of the wrong type...
        part = split_part(path)
        message = _split_reason(part) if part else _without_path(exc, path)
        return ModelFileSummary(str(path), size, source, shown, error=message)
    metadata = gguf_file.metadata
    mix = tuple((name, n, b) for name, (n, b) in gguf_file.quant_mix().items())
    context = config.context_length if config else gguf_file.arch_value("context_length")
    return ModelFileSummary(
        path=str(path),
        size=size,
        source=source,
        display_name=shown,
        name=_text(metadata.get("general.name")),
        architecture=gguf_file.arch,
        parameters=gguf_file.parameter_count(),
        quant=_quant_label(gguf_file, mix),
        quant_mix=mix,
        context_length=context if isinstance(context, int) else None,
        has_chat_template=bool(metadata.get("tokenizer.chat_template")),
        base_model=is_base_model(metadata),
        supported=reason is None,
        unsupported_reason=reason,
    )


def _quant_label(gguf_file: GGUFFile, mix: tuple[tuple[str, int, int], ...]) -> str | None:
    """llama.cpp's name for the file type (Q4_K_M), else the type holding the most bytes."""
    file_type = gguf_file.metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    return mix[0][0] if mix else None


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _without_path(exc: Exception, path: Path) -> str:
    """The message without the leading "<path>: " (the library shows the path in its own column)."""
    message = str(exc)
    prefix = f"{path}: "
    return message[len(prefix) :] if message.startswith(prefix) else message
