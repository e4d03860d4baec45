#!/usr/bin/env bash
# Sets up .venv with the test extras (models included) and runs the whole test suite offscreen.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh test
export QT_QPA_PLATFORM=offscreen
exec .venv/bin/python -m pytest -q "$@"
