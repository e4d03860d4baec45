"""Write tests/fixtures/oracle_<model>.json: reference logits from HF transformers (an independent
implementation) for the forward-pass tests, and the tiny random GGUFs they run on.

transformers loads a GGUF by dequantizing every weight to float32, then runs its own PyTorch
model code in float32 (eager attention). Our engine reads the same quantized weights, so both
compute the same function and differ only by float rounding (and our float16 KV cache).

Not a test dependency: needs torch (the local CPU wheel, `pip install torch==2.13.0`),
transformers, accelerate, sentencepiece and protobuf in .venv. Run once after a change to what
is recorded (each real-model load takes ~1 min and ~2.6 GB):

    .venv/bin/python tools/make_oracle_fixtures.py [smollm2 gemma3 tiny tiny_hf tiny_hf:NAME,..]

(`tiny_hf:gpt_oss` rewrites only that fixture; plain `tiny_hf` rewrites every one of them.)

Recorded per prompt (token ids given explicitly, so no tokenizer is under test):
  * at chosen positions: the top-k token ids and logits, and the logits of fixed "probe" ids
    spread over the vocabulary (so the tail of the distribution is checked too);
  * a greedy continuation computed with transformers' own KV cache, with the top1-top2 logit
    margin at every step (tests compare only where the margin is clear).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"

TOP_K = 10
N_PROBES = 32
GREEDY_REAL = 12
GREEDY_TINY = 8

# Tiny random models committed under tests/fixtures/: small dims, tied output (the 49k-token
# vocabulary dominates the size), a quantized embedding and no vocabulary strings (the forward
# pass never reads them; they would add 1.8 MB) so each file stays under ~1 MB, and a different
# block type in the layers of each so the oracle covers several dequantizers.
TINY_VOCAB_STRINGS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.chat_template",
)
TINY_MODELS = {
    "llama": dict(
        qtype="Q8_0", d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, n_layers=2
    ),
    "qwen2": dict(
        qtype="F16", d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, n_layers=2
    ),
    "qwen3": dict(
        qtype="Q5_1", d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, n_layers=2
    ),
    "gemma3": dict(
        qtype="Q4_1",
        d_model=32,
        n_heads=4,
        n_kv_heads=1,
        head_dim=8,
        d_ff=64,
        n_layers=6,
        sliding_window=8,
    ),
}


def tiny_model_path(arch: str) -> Path:
    return FIXTURES / f"tiny_{arch}.gguf"


def _load_hf(path: Path, **config_overrides):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation="eager",
        **config_overrides,
    )
    model.eval()
    return model


def _probe_ids(vocab: int, seed: int) -> list[int]:
    return sorted(
        int(i) for i in np.random.default_rng(seed).choice(vocab, N_PROBES, replace=False)
    )


def _record_case(
    model, name: str, ids: list[int], positions: list[int], n_greedy: int, probe_ids: list[int]
) -> dict:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        logits = out.logits[0].double().numpy()  # (T, vocab)
        past = out.past_key_values
        greedy, margins = [], []
        step_logits = logits[-1]
        for _ in range(n_greedy):
            order = np.argsort(-step_logits)
            token = int(order[0])
            greedy.append(token)
            margins.append(float(step_logits[order[0]] - step_logits[order[1]]))
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            step_logits = out.logits[0, -1].double().numpy()
    topk_ids, topk_logits, probe_logits = [], [], []
    for p in positions:
        order = np.argsort(-logits[p])[:TOP_K]
        topk_ids.append([int(i) for i in order])
        topk_logits.append([round(float(logits[p, i]), 5) for i in order])
        probe_logits.append([round(float(logits[p, i]), 5) for i in probe_ids])
    return dict(
        name=name,
        prompt_ids=[int(i) for i in ids],
        positions=positions,
        topk_ids=topk_ids,
        topk_logits=topk_logits,
        probe_logits=probe_logits,
        greedy=greedy,
        greedy_margins=[round(m, 4) for m in margins],
    )


def _versions() -> str:
    import torch
    import transformers

    return f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention"


def _write(model_name: str, payload: dict) -> None:
    target = FIXTURES / f"oracle_{model_name}.json"
    target.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
    print(f"wrote {target} ({target.stat().st_size} bytes)")


def _hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def make_smollm2() -> None:
    from engine.model_files import default_model_path

    path = default_model_path()
    tok = _hf_tokenizer(path)
    chat = tok.encode(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    story = tok.encode(
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        add_special_tokens=False,
    )
    model = _load_hf(path)
    vocab = model.config.vocab_size
    probes = _probe_ids(vocab, seed=1)
    cases = [
        _record_case(
            model, "chat_capital", chat, [0, len(chat) // 2, len(chat) - 1], GREEDY_REAL, probes
        ),
        _record_case(model, "story", story, [3, len(story) - 1], GREEDY_REAL, probes),
    ]
    _write(
        "smollm2",
        dict(
            model="SmolLM2-135M-Instruct Q4_1",
            file=path.name,
            file_size=path.stat().st_size,
            source=_versions(),
            probe_ids=probes,
            cases=cases,
        ),
    )


def make_gemma3() -> None:
    from engine.model_files import gemma3_270m_path

    path = gemma3_270m_path()
    tok = _hf_tokenizer(path)
    short = tok.encode("The capital of France is", add_special_tokens=True)
    counting = tok.encode(", ".join(str(i) for i in range(1, 181)) + ",", add_special_tokens=True)
    assert len(counting) > 600, len(counting)
    n = len(counting)
    model = _load_hf(path)
    vocab = model.config.vocab_size
    probes = _probe_ids(vocab, seed=2)
    cases = [
        _record_case(model, "capital", short, [1, len(short) - 1], GREEDY_REAL, probes),
        # Past position 512 the local layers' window drops the start of the prompt.
        _record_case(
            model, "counting_long", counting, [100, 511, 512, 600, n - 1], GREEDY_REAL, probes
        ),
    ]
    _write(
        "gemma3",
        dict(
            model="gemma-3-270m Q4_K_M",
            file=path.name,
            file_size=path.stat().st_size,
            source=_versions(),
            probe_ids=probes,
            cases=cases,
        ),
    )


def make_tiny() -> None:
    from gguf import GGMLQuantizationType

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import write_tiny_model

    for arch, dims in TINY_MODELS.items():
        dims = dict(dims)
        qtype = GGMLQuantizationType[dims.pop("qtype")]
        path = write_tiny_model(
            tiny_model_path(arch),
            arch,
            qtype,
            seed=7,
            tie_embeddings=True,
            embedding_qtype=GGMLQuantizationType.Q4_0,
            weight_scale=0.2,
            omit_keys=TINY_VOCAB_STRINGS,
            **dims,
        )
        # Without the token list transformers cannot infer the vocabulary size.
        overrides = {"vocab_size": 49152}
        if arch in ("qwen3", "gemma3"):
            overrides["head_dim"] = dims[
                "head_dim"
            ]  # not mapped from GGUF key_length by transformers
        if arch == "gemma3":
            # llama.cpp (and our engine) scale scores by 1/sqrt(head_dim); transformers takes it
            # from query_pre_attn_scalar (256 by default, == head_dim in the real 270m model).
            overrides.update(
                query_pre_attn_scalar=dims["head_dim"], sliding_window=dims["sliding_window"]
            )
        model = _load_hf(path, **overrides)
        vocab = model.config.vocab_size
        probes = _probe_ids(vocab, seed=3)
        ids = [int(i) for i in np.random.default_rng(11).integers(0, vocab, 24)]
        case = _record_case(model, "random_ids", ids, list(range(len(ids))), GREEDY_TINY, probes)
        _write(
            f"tiny_{arch}",
            dict(
                model=f"tiny random {arch}",
                file=path.name,
                file_size=path.stat().st_size,
                source=_versions(),
                probe_ids=probes,
                cases=[case],
            ),
        )


def make_tiny_hf(names: list[str] | None = None) -> None:
    """The architectures transformers cannot load from GGUF (and the RoPE scaling variants):
    a random HF checkpoint from the arch's own config class is the source, written to GGUF by
    tools/tiny_hf_models.py, and transformers' logits on the dequantized weights the reference."""
    from tools.tiny_hf_models import SPECS, build_hf_model, write_gguf

    for name in names or list(SPECS):
        model, spec = build_hf_model(name)
        path = write_gguf(model, spec, FIXTURES / f"tiny_{name}.gguf")
        vocab = model.config.vocab_size
        probes = _probe_ids(vocab, seed=3)
        rng = np.random.default_rng(11)
        ids = [int(i) for i in rng.integers(0, vocab, 24)]
        cases = [_record_case(model, "random_ids", ids, list(range(len(ids))), GREEDY_TINY, probes)]
        if spec["arch"] == "phi3":
            # Within the original context (8 + 8 positions <= 16): LongRoPE's short factors.
            short = [int(i) for i in rng.integers(0, vocab, 8)]
            cases.append(_record_case(model, "short_context", short, list(range(8)), 8, probes))
        _write(
            f"tiny_{name}",
            dict(
                model=f"tiny random {name} ({spec['hf']} config class, {spec['qtype'].name}"
                + (f", {spec['expert_qtype'].name} experts" if "expert_qtype" in spec else "")
                + ")",
                file=path.name,
                file_size=path.stat().st_size,
                source=_versions() + ", weights from the HF model, dequantized GGUF values",
                probe_ids=probes,
                cases=cases,
            ),
        )


def main(argv: list[str]) -> None:
    jobs = {
        "tiny": make_tiny,
        "tiny_hf": make_tiny_hf,
        "smollm2": make_smollm2,
        "gemma3": make_gemma3,
    }
    for name in argv or list(jobs):
        if name.startswith("tiny_hf:"):
            make_tiny_hf(name.removeprefix("tiny_hf:").split(","))
        else:
            jobs[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
