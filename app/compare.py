"""The compare view's logic, no widgets: what each column has received, where two columns first
chose different tokens, and a reply rendered with per-token confidence shading.

Two columns share a tokenizer when they run on the same model (today: always, one model is
loaded at a time), so their token ids are comparable position by position. The divergence is the
first generated position whose token ids differ; the distributions shown there are each
column's top alternatives at that position (TokenSampled.top: log-probabilities after the
preset's processors, what the sampler chose from).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from engine.events import Finished, TokenSampled, Usage

COMPARE_TOP_LOGPROBS = 5  # alternatives recorded per token: the divergence shows them


@dataclass
class ColumnState:
    overrides: dict
    tokens: list[TokenSampled] = field(default_factory=list)
    text: str = ""
    usage: Usage | None = None
    finished: Finished | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None


def first_divergence(a: list[TokenSampled], b: list[TokenSampled]) -> int | None:
    """The first position where the token ids differ; where one column stopped earlier, the
    position after its last token; None when both are the same token for token."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.token_id != y.token_id:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def probability(token: TokenSampled) -> float:
    return math.exp(token.logprob) if token.logprob is not None else 1.0


def shade(p: float) -> str:
    """Background for a token chosen with probability p: clear when certain, warmer as it
    drops (alpha grows with 1 - p), so uncertain spans stand out."""
    alpha = min(0.85, max(0.0, (1.0 - p) * 0.9))
    return f"rgba(255, 140, 0, {alpha:.2f})"


def reply_html(tokens: list[TokenSampled], divergence: int | None = None) -> str:
    """The reply as token spans shaded by confidence; the divergence token outlined in red."""
    parts = []
    for token in tokens:
        piece = html.escape(token.text).replace("\n", "<br>")
        p = probability(token)
        style = f"background-color: {shade(p)};"
        if token.index == divergence:
            style += " border: 2px solid #d00; color: #d00; font-weight: bold;"
        parts.append(f'<span style="{style}" title="p={p:.3f}">{piece}</span>')
    return "".join(parts)


def distribution_text(token: TokenSampled | None) -> list[tuple[str, float, bool]]:
    """(token text, probability, chosen) for the alternatives at one position, best first."""
    if token is None:
        return []
    rows = [(alt.text, math.exp(alt.logprob), alt.token_id == token.token_id) for alt in token.top]
    if not any(chosen for _, _, chosen in rows):
        rows.append((token.text, probability(token), True))
    return sorted(rows, key=lambda r: -r[1])


def usage_line(usage: Usage | None, finished: Finished | None) -> str:
    if usage is None:
        return ""
    line = (
        f"{usage.completion_tokens} tokens · TTFT {usage.ttft_ms:.0f} ms · "
        f"{usage.decode_tok_s:.1f} tok/s · prompt {usage.prompt_tokens}"
    )
    if usage.cached_tokens:
        line += f" ({usage.cached_tokens} cached)"
    if finished is not None:
        line += f" · {finished.finish_reason}"
    return line
