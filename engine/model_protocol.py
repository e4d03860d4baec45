"""LanguageModel: what generation, context fitting, prefix reuse, drafting and the benchmarks read
from a loaded model. engine.loader.LoadedModel implements it; the signatures name this protocol
rather than LoadedModel so a test double with the same members stands in without subclassing.

Import-light on purpose (engine.types refers to it): the member types are imported for the
checker only."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engine.chat_template import ChatTemplate
    from engine.config import ModelConfig
    from engine.gguf import GGUFFile
    from engine.kernels.backend import Backend
    from engine.models.transformer import TransformerModel
    from engine.tokenizer import Tokenizer


class LanguageModel(Protocol):
    """A model file opened for inference: its weights, vocabulary, template and window."""

    @property
    def path(self) -> Path: ...

    @property
    def gguf(self) -> GGUFFile:
        """The parsed file (metadata, architecture, tensor quant types)."""
        ...

    @property
    def config(self) -> ModelConfig: ...

    @property
    def model(self) -> TransformerModel:
        """The forward pass: new_cache(n_ctx) and forward(ids, cache, ...) under forward_lock."""
        ...

    @property
    def backend(self) -> Backend: ...

    @property
    def n_ctx(self) -> int:
        """The context window the KV cache is sized for (may be below the trained length)."""
        ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def chat_template(self) -> ChatTemplate: ...
