#!/usr/bin/env bash
# Sets up .venv (only the first run, or a changed pyproject.toml, runs pip: later launches work
# offline) and starts the desktop app.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/bootstrap.sh
# The default embedding model for documents, in this user's cache: bootstrap makes it when it
# installs, but a later launch skips bootstrap's work, and another user (or a cleared cache) has
# none yet. A no-op (~0.2 s) when the file there was made from the installed package.
.venv/bin/python -m tools.make_embedding_model > /dev/null
exec .venv/bin/python -m app "$@"
