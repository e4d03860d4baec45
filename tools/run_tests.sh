#!/usr/bin/env bash
# Sets up .venv with the test extras (models included), runs ruff and mypy, then the whole test
# suite offscreen, on one worker process per core (pytest-xdist; pyproject addopts). Arguments go
# to pytest (e.g. -m "not slow" for the fast tier, -n 0 to run serially).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh test,peer
# The 1.1 GB Qwen2.5-Coder file for the slow tool-call test: fetched and checked once per machine
# into the user cache (a no-op once it is there).
.venv/bin/python -m tools.fetch_qwen_coder > /dev/null
# The default embedding model's GGUF (tools/make_embedding_model.py): bootstrap makes it when it
# installs; this remakes it if the cache was cleared since (a no-op when it is there).
.venv/bin/python -m tools.make_embedding_model > /dev/null
# Lint and types first: a finding fails the run before the (minutes-long) suite starts.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
export QT_QPA_PLATFORM=offscreen
# Everything a test needs was installed above (llama.cpp, the test models, Qwen): a test that
# still finds one missing fails instead of skipping (tests/requirements.py), so a set-up that
# broke can never pass as a run with dozens of silent skips.
export LOCALCHAT_REQUIRE_ALL=1
exec .venv/bin/python -m pytest -q "$@"
