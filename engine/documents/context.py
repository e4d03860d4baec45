"""The sources block a prompt carries: retrieved chunks with numbered markers ([1] file p.3 >
Heading), fitted into a token budget counted with the chat model's tokenizer.

It returns what went in and what was left out for lack of room, so the app's "Sources" view
and the CLI's --json can show both, and the receipt can record exactly what the model saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.documents.defaults import DEFAULT_BUDGET_TOKENS
from engine.documents.retrieve import Retrieved
from engine.errors import ConfigValidationError

INSTRUCTIONS = (
    "Answer using the numbered sources below. Cite the sources you use with their marker, "
    "like [1]. If the sources do not hold the answer, say so."
)


@dataclass(frozen=True)
class Source:
    marker: int | None  # the [n] in the prompt; None for a source left out
    item: Retrieved
    tokens: int  # what its entry costs in the prompt

    def header(self) -> str:
        return f"[{self.marker}] {self.item.chunk.place()}"


@dataclass
class ContextBlock:
    text: str  # "" when nothing fitted
    budget_tokens: int
    used_tokens: int
    included: list[Source] = field(default_factory=list)
    left_out: list[Source] = field(default_factory=list)


def _entry(marker: int, item: Retrieved) -> str:
    return f"[{marker}] {item.chunk.place()}\n{item.chunk.text}"


def build_context(
    results: list[Retrieved],
    count_tokens: Callable[[str], int],
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
) -> ContextBlock:
    """Take results in rank order while they fit; one that does not fit is left out and the next
    (perhaps shorter) ones are still tried, so the budget is used rather than wasted."""
    if budget_tokens < 1:
        raise ConfigValidationError("source budget", budget_tokens, "at least 1 token")
    block = ContextBlock("", budget_tokens, 0)
    parts = [INSTRUCTIONS]
    used = count_tokens(INSTRUCTIONS + "\n\n")
    for item in results:
        marker = len(block.included) + 1
        entry = _entry(marker, item)
        cost = count_tokens(entry + "\n\n")
        if used + cost <= budget_tokens:
            parts.append(entry)
            used += cost
            block.included.append(Source(marker, item, cost))
        else:
            block.left_out.append(Source(None, item, cost))
    if block.included:
        block.text = "\n\n".join(parts)
        block.used_tokens = count_tokens(block.text)
    return block


def prompt_messages(question: str, block: ContextBlock, system: str | None = None) -> list[dict]:
    """Chat messages for a question over the sources: the sources go in the system message (so a
    multi-turn chat keeps them apart from what the user typed)."""
    system_parts = [p for p in (system, block.text) if p]
    messages = [{"role": "system", "content": "\n\n".join(system_parts)}] if system_parts else []
    messages.append({"role": "user", "content": question})
    return messages
