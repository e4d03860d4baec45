"""What a test needs from outside the checkout, and what happens when it is missing.

A test that needs llama.cpp (llama-cpp-python: the real OpenAI-compatible server, the quantizer,
the tokenizer oracle) or a packaged model calls `missing(what, how)` when the part is not there.
By default that is a skip whose reason says what is missing and the command that brings it, so
`pytest -rs` (in pyproject's addopts) lists every such skip with its remedy instead of a bare
count. `tools/run_tests.sh` (the README's test command, and so CI) installs every one of these
parts and sets LOCALCHAT_REQUIRE_ALL=1: there a missing part fails the test, so a broken set-up
can never pass as "74 skipped".
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ALL_ENV = "LOCALCHAT_REQUIRE_ALL"

PEER_HOW = "run `bash tools/run_tests.sh` (it builds llama-cpp-python[server] once per machine)"
QWEN_HOW = "run `python -m tools.fetch_qwen_coder` (or `bash tools/run_tests.sh`, which does)"
MODELS_HOW = "run `bash tools/run_tests.sh` (it installs the test models from PyPI)"
EMBED_HOW = "run `python -m tools.make_embedding_model` (tools/bootstrap.sh and run_tests.sh do)"


def required() -> bool:
    """Whether a missing part fails the test rather than skipping it."""
    return os.environ.get(REQUIRE_ALL_ENV, "") not in ("", "0")


def missing(what: str, how: str):
    """Skip (or, under LOCALCHAT_REQUIRE_ALL=1, fail) the current test: `what` is not available."""
    reason = f"needs {what}: {how}"
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ALL_ENV}=1: the README's test command provides it)")
    pytest.skip(reason)
