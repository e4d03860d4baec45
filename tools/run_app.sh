#!/usr/bin/env bash
# Sets up .venv (first run only does real work) and starts the desktop app.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
exec .venv/bin/python -m app "$@"
