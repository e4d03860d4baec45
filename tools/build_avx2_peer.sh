#!/usr/bin/env bash
# Builds llama.cpp (llama-cpp-python 0.3.36, the version of the `peer` extra) for AVX2 only, into
# a directory of its own, for issue 11's AVX2 comparisons: our engine on its AVX2 path
# (LOCALCHAT_CPU=haswell) against a llama.cpp that cannot use AVX-512 either. Not part of the
# test set-up; ~10 minutes on 2 cores, once.
#
#   bash tools/build_avx2_peer.sh [DIR]        (default ~/.cache/localchat-bench/peer-avx2)
#   PYTHONPATH=DIR LOCALCHAT_CPU=haswell .venv/bin/python bench/compare_llamacpp.py MODEL ...
#
# PYTHONPATH puts this build's llama_cpp ahead of the .venv's AVX-512 one; the benchmark prints
# which llama_cpp it imported.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-$HOME/.cache/localchat-bench/peer-avx2}
mkdir -p "$dir"
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
-DGGML_AVX512_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  .venv/bin/python -m pip install -q --no-cache-dir --no-deps --target "$dir" llama-cpp-python==0.3.36
echo "AVX2-only llama.cpp in $dir"
