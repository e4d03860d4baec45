"""Logit error against the transformers oracle fixtures, for our kernels and for llama.cpp.

    .venv/bin/python bench/fidelity_vs_oracle.py smollm2|gemma3 jit|numpy|llamacpp

Compares raw logits at the recorded positions and top-k ids of tests/fixtures/oracle_<model>.json
(float32 transformers over dequantized weights). `numpy` = our float32 reference path
(LOCALCHAT_KERNELS=numpy is set for you), `jit` = our default kernels (int8 activations, as
llama.cpp), `llamacpp` = llama-cpp-python (optional, not a project dependency).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    which, mode = sys.argv[1], sys.argv[2]
    if mode == "numpy":
        os.environ["LOCALCHAT_KERNELS"] = "numpy"
    from engine.model_files import default_model_path, gemma3_270m_path

    path = default_model_path() if which == "smollm2" else gemma3_270m_path()
    oracle = json.loads((ROOT / "tests" / "fixtures" / f"oracle_{which}.json").read_text())
    n_ctx = 2048
    if mode == "llamacpp":
        from llama_cpp import Llama

        llm = Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=2)

        def all_logits(ids):
            llm.reset()
            llm.eval(ids)
            return np.array(llm.scores[: len(ids)], dtype=np.float64)
    else:
        from engine.loader import load_model

        lm = load_model(path, n_ctx=n_ctx)

        def all_logits(ids):
            cache = lm.model.new_cache(n_ctx)
            return lm.model.forward(ids, cache, all_logits=True).astype(np.float64)

    errors = []
    for case in oracle["cases"]:
        logits = all_logits(case["prompt_ids"])
        for i, pos in enumerate(case["positions"]):
            ref_ids = np.asarray(case["topk_ids"][i])
            errors.append(np.abs(logits[pos][ref_ids] - np.asarray(case["topk_logits"][i])))
    err = np.concatenate(errors)
    print(
        f"{which} {mode}: max abs logit error {err.max():.4f}, mean {err.mean():.4f} "
        f"over {err.size} top-k logits"
    )


if __name__ == "__main__":
    main()
