"""Batched decode through native step lists (engine/models/batch_decode.py, issue 32): a step of
N sequences with one new token each must give every sequence exactly the logits and K/V bytes it
gets decoded alone, whichever slot of the batch it sits in and whoever sits beside it.

Tiny random-weight models (tests/tiny_models.py) on the JIT backend with two threads (the steps'
chunking is part of what must match), so this runs in the fast tier.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tiny_models import write_tiny_model

from engine.config import ModelConfig
from engine.gguf import open_gguf
from engine.kernels.jit_backend import JitBackend
from engine.models import batch_decode, build_model
from engine.models.batch_decode import DECODE_STEPS_ENV, BatchDecodePlan
from engine.models.transformer import Segment
from engine.types import KvCacheType

# head_dim 64 (the attention kernel's multiple), as in real models
SHAPES = dict(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512, tokenizer=None)
PROMPTS = (3, 9, 5, 14, 7)  # prompt lengths of the five sequences: each decodes at its own p0
STEPS = 12


@pytest.fixture(scope="module")
def backend():
    backend = JitBackend(2)
    yield backend
    backend.close()


WINDOWED = ("gemma2", "gemma3")
WINDOW = 8  # shorter than the longest sequence (14 + 12 tokens): the window slides


def _model(tmp_path, arch: str, backend):
    window = dict(sliding_window=WINDOW) if arch in WINDOWED else {}
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, Q.Q8_0, seed=3, **SHAPES, **window)
    gguf_file = open_gguf(path)
    model = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
    model.cache_type = KvCacheType.F16
    return model


def _schedule(rng: np.random.Generator) -> list[list[int]]:
    """Which sequences decode in each step, in which order: every size from 2 to 5, the order
    shuffled so a cache moves between slots and a slot sees different caches."""
    steps = []
    for i in range(STEPS):
        size = 2 + i % 4
        steps.append(rng.permutation(len(PROMPTS))[:size].tolist())
    return steps


def _run(model, tokens: dict[int, list[int]], schedule, batched: bool):
    """Prefill every prompt, then feed each step's tokens; -> (per sequence, its decode logits
    in order), caches. batched: one forward_segments per step; else one forward() per token."""
    caches = [model.new_cache(64) for _ in PROMPTS]
    for s, n in enumerate(PROMPTS):
        model.forward(tokens[s][:n], caches[s])
    fed = list(PROMPTS)
    logits: dict[int, list[np.ndarray]] = {s: [] for s in range(len(PROMPTS))}
    for step, seqs in enumerate(schedule):
        # every third step the first sequence asks for no logits (a draft's filler row)
        wanted = {s: ([] if step % 3 == 0 and j == 0 else [0]) for j, s in enumerate(seqs)}
        if batched:
            out = model.forward_segments(
                [Segment([tokens[s][fed[s]]], caches[s], wanted[s]) for s in seqs]
            )
            for s, rows in zip(seqs, out, strict=True):
                assert rows.shape == (len(wanted[s]), model.config.n_vocab)
                logits[s] += list(rows)
        else:
            for s in seqs:
                row = model.forward([tokens[s][fed[s]]], caches[s])
                if wanted[s]:
                    logits[s].append(row)
        for s in seqs:
            fed[s] += 1
    return logits, caches


# qwen2: per-row q/k/v bias steps; qwen3: per-head q/k norms; gemma2/3: sandwich norms, q/k
# norms (gemma3), GeGLU, soft-caps (gemma2), embedding scale, sliding windows
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3"])
def test_a_batched_decode_step_gives_every_sequence_its_bits_alone(tmp_path, backend, arch):
    model = _model(tmp_path, arch, backend)
    rng = np.random.default_rng(11)
    tokens = {
        s: rng.integers(0, model.config.n_vocab, n + STEPS).tolist() for s, n in enumerate(PROMPTS)
    }
    schedule = _schedule(rng)
    alone, alone_caches = _run(model, tokens, schedule, batched=False)
    together, caches = _run(model, tokens, schedule, batched=True)
    # the steps ran, for every batch size used (not the op-by-op loop)
    plans = batch_decode._plans[model]
    assert all(isinstance(plans[size], BatchDecodePlan) for size in (2, 3, 4, 5)), plans
    for s in range(len(PROMPTS)):
        assert len(together[s]) == len(alone[s]) > 0
        for i, (a, b) in enumerate(zip(together[s], alone[s], strict=True)):
            assert np.array_equal(a, b), f"sequence {s}, decode {i}: logits differ from alone"
        mine, theirs = caches[s], alone_caches[s]
        assert mine.tokens == theirs.tokens
        n = mine.n_tokens
        assert np.array_equal(mine.k[:, :n].view(np.uint16), theirs.k[:, :n].view(np.uint16))
        assert np.array_equal(mine.v[:, :n].view(np.uint16), theirs.v[:, :n].view(np.uint16))


def test_architectures_without_a_step_form_keep_the_loop_and_its_bits(tmp_path, backend):
    # Granite's residual multiplier has no step here: the loop runs, still exact
    model = _model(tmp_path, "granite", backend)
    rng = np.random.default_rng(4)
    tokens = {
        s: rng.integers(0, model.config.n_vocab, n + STEPS).tolist() for s, n in enumerate(PROMPTS)
    }
    schedule = _schedule(rng)
    alone, _ = _run(model, tokens, schedule, batched=False)
    together, _ = _run(model, tokens, schedule, batched=True)
    assert set(batch_decode._plans[model].values()) == {False}
    for s in range(len(PROMPTS)):
        for a, b in zip(together[s], alone[s], strict=True):
            assert np.array_equal(a, b)


def test_steps_off_keeps_the_loop(tmp_path, backend, monkeypatch):
    monkeypatch.setenv(DECODE_STEPS_ENV, "0")
    model = _model(tmp_path, "llama", backend)
    caches = [model.new_cache(8) for _ in range(2)]
    model.forward_segments([Segment([1], caches[0], [0]), Segment([2], caches[1], [0])])
    assert batch_decode._plans[model] == {2: False}
