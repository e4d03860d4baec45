"""engine/types.py: one definition of the shared engine vocabulary, importable without numpy."""

import os
import subprocess
import sys
from pathlib import Path

from engine.events import FINISH_REASONS
from engine.types import FinishReason, JsonMode, MessageStatus

ROOT = Path(__file__).resolve().parent.parent


def test_the_app_can_build_requests_without_loading_numpy():
    # The window opens before numpy/llvmlite load: the types it uses must not pull them in.
    code = (
        "import sys, engine.types, app.session, app.views.main_window; "
        "heavy = [m for m in ('numpy', 'llvmlite') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_enum_members_are_their_strings_as_stored_and_sent():
    # Values come back from SQLite, JSON and argv as plain strings and must compare equal.
    assert FinishReason("grammar_complete") is FinishReason.GRAMMAR_COMPLETE
    assert MessageStatus.CANCELLED == "cancelled" and f"{JsonMode.SCHEMA}" == "schema"
    assert tuple(FinishReason) == FINISH_REASONS
