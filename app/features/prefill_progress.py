"""Prefill progress in the window: "Reading prompt 1,024 / 3,800 tokens · 85 tok/s · ~33 s left".

One path for every place that shows it: the engine's PrefillProgress event (engine/events.py)
travels in the worker's EventBatch (app/worker.py, newest one per drain) and reaches
- the chat's status line through EngineController.replyProgress -> ChatSession.replyProgress ->
  PrefillStatus below,
- a compare column through compareBatch (app/compare.py keeps it on the column),
- the Serve status line through the server's status snapshot (engine/server/background.py,
  the scheduler's newest progress per running request),
and each of them words it with engine.prefill_progress.describe_progress (the CLI's line too).
"""

from __future__ import annotations

from PySide6.QtCore import QObject

from engine.events import PrefillProgress
from engine.prefill_progress import describe_progress

__all__ = ["PrefillStatus", "describe_progress", "explain_progress", "prefill_running"]

READING = "Reading prompt"
GENERATING = "Generating… (Esc to stop)"


def explain_progress(progress: PrefillProgress) -> str:
    """A tooltip: where the numbers come from."""
    text = f"The model reads the {progress.total:,}-token prompt before it can answer"
    if progress.cached:
        text += f" ({progress.cached:,} of them were kept from the previous reply)"
    text += f"; {progress.elapsed_s:.1f} s so far."
    if progress.eta_s is not None:
        text += (
            " The time left counts later tokens as slower: each one attends to every token "
            "before it."
        )
    return text


def prefill_running(progress: PrefillProgress | None) -> bool:
    return progress is not None and progress.done < progress.total


class PrefillStatus(QObject):
    """The chat's status line while the prompt is read; back to "Generating…" once it is read,
    cleared when the reply ends before that (Stop, an error)."""

    def __init__(self, session, label, parent: QObject | None = None):
        super().__init__(parent)
        self._label = label
        session.replyProgress.connect(self.show)
        session.busyChanged.connect(self._on_busy)

    def show(self, progress: PrefillProgress) -> None:
        if prefill_running(progress):
            self._label.setText(describe_progress(progress))
            self._label.setToolTip(explain_progress(progress))
        elif self._label.text().startswith(READING):
            self._label.setText(GENERATING)
            self._label.setToolTip("")

    def _on_busy(self, busy: bool) -> None:
        if not busy and self._label.text().startswith(READING):
            self._label.setText("")
            self._label.setToolTip("")
