"""A reply's "Details": its receipt (model file and sha256, engine, chat template, prompt, the
preset with each value's source, seed, JSON mode, finish reason and usage, the document passages
its prompt carried and the summary it was built on) and Replay, which runs it again from the
receipt and says whether it reproduces exactly or where it diverged."""

from __future__ import annotations

import html
import json
import math

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.types import ReplayReport, TokenChoice

# What the Sources section says of each passage against the collection now (the app checks it on
# a thread, app/features/documents.py check_passages; until then: CHECKING).
UNCHANGED, CHANGED, REMOVED = "unchanged", "changed", "removed"
CHECKING = "checking"
PASSAGE_STATE = {
    UNCHANGED: "unchanged now",
    CHANGED: "changed since (its document was edited)",
    REMOVED: "no longer indexed",
    CHECKING: "checking…",
}

NO_RECEIPT = (
    "No receipt was recorded for this reply: it was generated before receipts existed, "
    "it failed, or its engine does not record them. It cannot be replayed."
)


class ReceiptDialog(QDialog):
    replayRequested = Signal(int)  # message id

    def __init__(self, message_id: int, receipt: dict | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.message_id = message_id
        self.receipt = receipt
        self.setWindowTitle("Reply details")
        self.resize(640, 620)
        layout = QVBoxLayout(self)
        self.body = QTextBrowser()
        self.body.setObjectName("receipt_body")
        self.passage_states: dict[int, str] | None = (
            None  # chunk id -> UNCHANGED/...; None: unknown
        )
        self.sources_note = ""  # why the passages could not be checked (the collection is gone)
        self.body.setHtml(receipt_html(receipt))
        layout.addWidget(self.body, 1)
        self.result = QLabel()
        self.result.setObjectName("replay_result")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.RichText)
        self.result.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.result.setVisible(False)
        layout.addWidget(self.result)
        buttons = QHBoxLayout()
        self.replay_button = QPushButton("Replay")
        self.replay_button.setToolTip(
            "Run this reply again from its receipt and check that it reproduces token for token"
        )
        self.replay_button.setEnabled(receipt is not None)
        self.replay_button.clicked.connect(lambda: self.replayRequested.emit(self.message_id))
        self.copy_button = QPushButton("Copy receipt")
        self.copy_button.setEnabled(receipt is not None)
        self.copy_button.clicked.connect(self._copy)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons.addWidget(self.replay_button)
        buttons.addWidget(self.copy_button)
        buttons.addStretch(1)
        buttons.addWidget(close)
        layout.addLayout(buttons)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(json.dumps(self.receipt, indent=2))

    def show_passage_states(self, states: dict[int, str] | None, note: str = "") -> None:
        """Each recorded passage's state in the collection now (chunk id -> UNCHANGED, CHANGED
        or REMOVED); None with a note when they could not be checked."""
        self.passage_states, self.sources_note = states, note
        scroll = self.body.verticalScrollBar().value()  # the reader stays where they were
        self.body.setHtml(receipt_html(self.receipt, states, note))
        self.body.verticalScrollBar().setValue(scroll)

    # --- replay ---------------------------------------------------------------------------------
    def show_replay_started(self) -> None:
        self.replay_button.setEnabled(False)
        self._show("Replaying… (Esc in the main window stops it)")

    def show_replay(self, report: ReplayReport) -> None:
        self.replay_button.setEnabled(self.receipt is not None)
        self.report = report
        self._show(replay_html(report))

    def show_replay_failed(self, message: str) -> None:
        self.replay_button.setEnabled(self.receipt is not None)
        self._show(f"<b>Replay failed:</b> {html.escape(message)}")

    def _show(self, text: str) -> None:
        self.result.setText(text)
        self.result.setVisible(True)


def _probability(logprob: float | None) -> str:
    if logprob is None:
        return "not recorded"
    p = math.exp(logprob)
    return f"{p:.1%}" if p >= 0.001 else f"{p:.2e}"


def _token(choice: TokenChoice | None, end: str) -> str:
    if choice is None:
        return f"<i>{end}</i>"
    return f"<code>{html.escape(repr(choice.text))}</code> (id {choice.token_id})"


def replay_html(report: ReplayReport) -> str:
    if report.stopped:
        return (
            f"<b>Replay stopped</b> after {report.replayed_tokens} of {report.original_tokens} "
            "tokens; those were all the same as the original."
        )
    if report.identical:
        head = (
            f"<b style='color:#2e8b57'>✔ Reproduced exactly</b>: all {report.original_tokens} "
            "tokens are the same, and the replay ended where the original did."
        )
    else:
        d = report.divergence
        head = "<b style='color:#c0392b'>✖ Did not reproduce.</b>"
        if d is not None:
            original = _token(d.original, "the original ended here")
            replayed = _token(d.replayed, "the replay ended here")
            head += (
                f" First difference at token {d.index + 1} of {report.original_tokens}:<br>"
                f"original {original}, model probability "
                f"{_probability(d.original.logprob if d.original else None)}"
            )
            if d.original is not None:
                head += f" (in the replay: {_probability(d.original_logprob_in_replay)})"
            head += (
                f"<br>replay {replayed}, model probability "
                f"{_probability(d.replayed.logprob if d.replayed else None)}"
            )
            if d.replayed is not None:
                head += f" (in the original: {_probability(d.replayed_logprob_in_original)})"
            if d.same_distribution:
                head += (
                    "<br>Both runs gave these tokens the same probabilities: the model saw the "
                    "same thing and the sampler chose differently (preset or seed)."
                )
            elif d.same_distribution is False:
                head += (
                    "<br>The probabilities differ: the model saw something else (model file, "
                    "prompt, template or kernels)."
                )
    if report.differences:
        items = "".join(f"<li>{html.escape(x)}</li>" for x in report.differences)
        head += f"<br>What differs in the receipt:<ul>{items}</ul>"
    elif not report.identical:
        head += "<br>The receipt matches this model, template, engine and preset."
    return head


def _row(name: str, value) -> str:
    return f"<tr><td><b>{html.escape(name)}</b></td><td>{html.escape(str(value))}</td></tr>"


def _file_name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _where(source: dict) -> str:
    """file.md p.3 › Heading › Sub: where a passage came from, as the Sources view says it."""
    where = _file_name(str(source.get("file") or "?"))
    if source.get("page") is not None:
        where += f" p.{source['page']}"
    heading = [str(h) for h in source.get("heading") or []]
    return " › ".join([where, *heading])


def sources_html(section: dict, states: dict[int, str] | None = None, note: str = "") -> str:
    """The receipt's "sources" section: the collection and query, then each passage the prompt
    carried (marker, file, page, heading, chunk id) and whether it is unchanged now."""
    passages = section.get("sources") or []
    left_out = section.get("left_out") or []
    settings = section.get("settings") or {}
    parts = ["<h3>Sources</h3><table>"]
    parts += [
        _row("Collection", section.get("collection")),
        _row("Question searched", section.get("query")),
        _row("Embedding model", section.get("embed_model")),
        _row(
            "Passages",
            f"{len(passages)} in the prompt, {section.get('used_tokens')} of "
            f"{section.get('budget_tokens')} tokens"
            + (f"; {len(left_out)} more found but left out (over the budget)" if left_out else ""),
        ),
    ]
    if settings.get("top_k") is not None:
        parts.append(_row("Retrieved (top k)", settings["top_k"]))
    parts.append("</table>")
    if note:
        parts.append(f"<p><i>{html.escape(note)}</i></p>")
    if passages:
        parts.append("<table cellspacing='6'>")  # the passage rows: file and state apart
        for s in passages:
            chunk_id = int(s.get("chunk_id", -1))
            state = CHECKING if states is None else states.get(chunk_id, REMOVED)
            if note:
                state = ""
            colour = {CHANGED: "#c0392b", REMOVED: "#c0392b", UNCHANGED: "#2e8b57"}.get(state)
            label = html.escape(PASSAGE_STATE.get(state, ""))
            shown = f"<span style='color:{colour}'>{label}</span>" if colour else f"<i>{label}</i>"
            parts.append(
                f"<tr><td><b>[{html.escape(str(s.get('marker')))}]</b></td>"
                f"<td>{html.escape(_where(s))}</td>"
                f"<td>chunk {chunk_id}</td><td>{shown}</td></tr>"
            )
        parts.append("</table>")
    return "".join(parts)


def compaction_html(section: dict) -> str:
    """The receipt's "compaction" section: the prompt was built on a summary of earlier
    messages instead of the messages themselves."""
    covered = section.get("covered_message_ids") or []
    n = len(covered)
    summary = str(section.get("summary") or "")
    excerpt = summary if len(summary) <= 300 else summary[:300].rstrip() + "…"
    parts = [
        "<h3>Compaction</h3><table>",
        _row(
            "Built on",
            f"a summary of {n} earlier message{'s' if n != 1 else ''} "
            "(the summary went into the prompt instead of them)",
        ),
        _row("Summary sha256", section.get("summary_sha256")),
        _row("Summary", excerpt),
        "</table>",
    ]
    return "".join(parts)


def receipt_html(
    receipt: dict | None, passage_states: dict[int, str] | None = None, sources_note: str = ""
) -> str:
    """The receipt as HTML; `passage_states` (chunk id -> UNCHANGED/CHANGED/REMOVED) says how
    each recorded passage stands now, None while it is being checked."""
    if receipt is None:
        return f"<p>{html.escape(NO_RECEIPT)}</p>"
    model = receipt.get("model", {})
    engine = receipt.get("engine", {})
    template = receipt.get("chat_template", {})
    prompt = receipt.get("prompt", {})
    preset = receipt.get("preset", {})
    output = receipt.get("output", {})
    usage = receipt.get("usage", {}) or {}
    parts = ["<h3>Model</h3><table>"]
    parts += [
        _row("File", model.get("file_name")),
        _row("sha256", model.get("sha256")),
        _row("Size", f"{int(model.get('size_bytes') or 0):,} bytes"),
        _row("Architecture", model.get("architecture")),
        _row("Engine", f"LocalChat {engine.get('version')} · {engine.get('kernels')}"),
        _row("Chat template", f"{template.get('name')} · sha256 {template.get('sha256')}"),
        "</table><h3>Prompt</h3><table>",
        _row("Tokens", prompt.get("n_tokens")),
        _row("Token ids sha256", prompt.get("sha256")),
        _row("Messages", len(prompt.get("messages") or [])),
        _row("JSON mode", receipt.get("json_mode")),
    ]
    if receipt.get("json_schema") is not None:
        parts.append(_row("JSON schema", json.dumps(receipt["json_schema"])))
    parts.append("</table><h3>Sampling</h3><table>")
    parts.append(_row("Seed used", preset.get("seed_used", "none (greedy)")))
    sources = preset.get("sources", {})
    for name, value in sorted((preset.get("values") or {}).items()):
        parts.append(
            f"<tr><td><b>{html.escape(name)}</b></td><td>{html.escape(json.dumps(value))}</td>"
            f"<td><i>{html.escape(str(sources.get(name, '')))}</i></td></tr>"
        )
    parts.append("</table><h3>Result</h3><table>")
    parts += [
        _row("Finish reason", output.get("finish_reason")),
        _row("Generated tokens", output.get("n_tokens")),
        _row("Prompt tokens", usage.get("prompt_tokens")),
        _row("Cached tokens", usage.get("cached_tokens")),
    ]
    if usage.get("ttft_ms") is not None:
        parts.append(_row("Time to first token", f"{usage['ttft_ms']:.0f} ms"))
    if usage.get("decode_tok_s"):
        parts.append(_row("Decode speed", f"{usage['decode_tok_s']:.1f} tok/s"))
    parts.append("</table>")
    if isinstance(receipt.get("sources"), dict):
        parts.append(sources_html(receipt["sources"], passage_states, sources_note))
    if isinstance(receipt.get("compaction"), dict):
        parts.append(compaction_html(receipt["compaction"]))
    return "".join(parts)
