#!/usr/bin/env bash
# Sets up .venv (only the first run, or a changed pyproject.toml, runs pip: later launches work
# offline) and starts the desktop app.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
exec .venv/bin/python -m app "$@"
