#!/usr/bin/env bash
# Sets up .venv with the test extras (models included), runs ruff and mypy, then the whole test
# suite offscreen, on one worker process per core (pytest-xdist; pyproject addopts). Arguments go
# to pytest (e.g. -m "not slow" for the fast tier, -n 0 to run serially).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh test
# Lint and types first: a finding fails the run before the (minutes-long) suite starts.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
export QT_QPA_PLATFORM=offscreen
exec .venv/bin/python -m pytest -q "$@"
