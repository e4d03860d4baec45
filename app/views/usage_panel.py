"""Usage: tokens, speeds, context bar and finish reason — live while streaming, per message after."""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QProgressBar, QWidget

from app.finish_reasons import NOTE_STREAMING, finish_label

IDLE_TITLE = "Usage — last reply"
LIVE_TITLE = "Usage — generating…"
SELECTED_TITLE = "Usage — selected reply"


class UsagePanel(QGroupBox):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(IDLE_TITLE, parent)
        form = QFormLayout(self)
        form.setContentsMargins(8, 8, 8, 8)
        self.fields: dict[str, QLabel] = {}
        for key, title, tip in (
            ("prompt_tokens", "Prompt tokens", "Tokens in the prompt after the chat template"),
            ("completion_tokens", "Reply tokens", "Tokens generated for the reply"),
            ("cached_tokens", "Cached tokens", "Prompt tokens reused from the prefix cache"),
            ("prompt_tok_s", "Prefill speed", "Prompt tokens processed per second"),
            ("decode_tok_s", "Decode speed", "Reply tokens generated per second"),
            ("finish_reason", "Finish", "Why the reply ended"),
        ):
            label = QLabel("—")
            label.setToolTip(tip)
            label.setObjectName("usage_" + key)
            self.fields[key] = label
            form.addRow(title, label)
        self.context_bar = QProgressBar()
        self.context_bar.setToolTip("Context window used by this conversation vs the model's limit")
        self.context_bar.setTextVisible(True)
        self.context_bar.setFormat("no reply yet")
        self.context_bar.setValue(0)
        form.addRow("Context", self.context_bar)
        # Remote replies: the server counts the tokens, the app times the stream.
        self.network_note = QLabel("Times measured by the app over the network")
        self.network_note.setObjectName("usage_network_note")
        self.network_note.setToolTip(
            "Token counts are the server's; time to first token and speeds are measured here "
            "from the stream, so they include the network round trip"
        )
        self.network_note.setVisible(False)
        form.addRow(self.network_note)

    def clear(self) -> None:
        """No reply to show (a new or empty chat, another model): nothing may still read as
        generating."""
        self.setTitle(IDLE_TITLE)
        self.network_note.setVisible(False)
        for label in self.fields.values():
            label.setText("—")
        self.context_bar.setRange(0, 1)
        self.context_bar.setValue(0)
        self.context_bar.setFormat("no reply yet")

    def show_usage(
        self, usage: dict | None, finish_reason: str | None = None, live: bool = False
    ) -> None:
        if not usage or "error" in usage:
            self.clear()
            if usage and "error" in usage:  # refused before the stream (ReplyRecorder.fail)
                self.fields["finish_reason"].setText("error")
                self.setTitle(SELECTED_TITLE)
            return
        self.setTitle(LIVE_TITLE if live else SELECTED_TITLE)
        f = self.fields
        self.network_note.setVisible(bool(usage.get("measured_over_network")))
        remote = bool(usage.get("measured_over_network"))
        # A server that sends no usage leaves the prompt uncounted (no prompt has 0 tokens).
        unreported = remote and not usage.get("prompt_tokens") and not live
        f["prompt_tokens"].setText(
            "not reported by the server" if unreported else _int(usage.get("prompt_tokens"))
        )
        f["completion_tokens"].setText(_int(usage.get("completion_tokens")))
        cached = usage.get("cached_tokens")
        not_known = "not reported" if remote else "not used"
        f["cached_tokens"].setText(not_known if cached is None else str(cached))
        f["prompt_tok_s"].setText(_rate(usage.get("prompt_tok_s")))
        f["decode_tok_s"].setText(_rate(usage.get("decode_tok_s")))
        f["finish_reason"].setText(
            NOTE_STREAMING
            if live
            else finish_label(finish_reason or usage.get("finish_reason"), usage)
        )
        used, limit = int(usage.get("context_used") or 0), int(usage.get("context_limit") or 0)
        self.context_bar.setRange(0, max(limit, 1))
        self.context_bar.setValue(min(used, limit))
        if not limit and remote:  # most servers do not say how long their context window is
            self.context_bar.setFormat("size not reported")
            return
        approx = "≈" if live else ""
        self.context_bar.setFormat(f"{approx}{used:,} / {limit:,} tokens" if limit else "—")

    def text_of(self, key: str) -> str:
        return self.fields[key].text()


def _int(value) -> str:
    return "—" if value is None else f"{int(value):,}"


def _rate(value) -> str:
    return "—" if not value else f"{value:,.1f} tok/s"
