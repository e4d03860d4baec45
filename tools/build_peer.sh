#!/usr/bin/env bash
# Builds and installs the `peer` extra (llama-cpp-python[server], i.e. llama.cpp from source) into
# .venv with visible progress. Called by tools/bootstrap.sh when the tests' set-up needs it and the
# venv does not have it yet; CMAKE_ARGS / CMAKE_BUILD_PARALLEL_LEVEL come from there.
#
# pip builds the wheel once and caches it, so on a machine that built it before this takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
requirement=$(.venv/bin/python - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print(tomllib.load(f)["project"]["optional-dependencies"]["peer"][0])
PY
)
log=.venv/llama-cpp-build.log
cat <<TEXT
==> Building llama.cpp ($requirement) from source for the tests.
    Why: the tests run a real OpenAI-compatible server (llama.cpp's), its quantizer makes the
    requantized test models, and its tokenizer and dequantizer are oracles for ours.
    How long: 10-25 minutes on two cores the first time on a machine (C++ compile; needs a C/C++
    compiler and CMake, e.g. Debian's build-essential and cmake, or the cmake wheel pip fetches).
    pip caches the built wheel, so later set-ups take seconds. Full log: $log
TEXT
started=$(date +%s)
# cmake prints "[ 42%] Building ...", ninja "[57/130] ..."; pass on one line per 5% step.
set +e
.venv/bin/python -m pip install -v --no-warn-conflicts "$requirement" 2>&1 | tee "$log" | awk -v start="$started" '
  function report(pct) {
    if (pct >= shown + 5 || (pct == 100 && shown < 100)) {
      shown = pct - pct % 5
      if (pct == 100) shown = 100
      cmd = "date +%s"; cmd | getline now; close(cmd)
      printf "    llama.cpp build %3d%%  (%d min %02d s)\n", pct, (now - start) / 60, (now - start) % 60
      fflush()
    }
  }
  BEGIN { shown = -5 }
  match($0, /^ *\[ *[0-9]+%\]/) { s = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", s); report(s + 0); next }
  match($0, /^ *\[[0-9]+\/[0-9]+\]/) { s = substr($0, RSTART, RLENGTH); gsub(/[\[\] ]/, "", s); split(s, f, "/"); if (f[2] > 0) report(int(100 * f[1] / f[2])); next }
  /Using cached llama_cpp_python|Found link.*llama_cpp_python.*whl|Successfully installed/ { print "    " $0; fflush() }
'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "==> The llama.cpp build failed (pip exit $status). The last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit "$status"
fi
echo "==> llama.cpp is installed ($(( $(date +%s) - started )) s)."
