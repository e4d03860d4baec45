"""How good is "Will it run here?": predict each model's decode / prefill speed and memory
(engine/run_prediction.py), then measure them with `python -m engine bench` in a fresh child
process, and print predicted vs measured with the error.

    python bench/bench_prediction.py                     # the test models, short runs
    python bench/bench_prediction.py path/a.gguf b.gguf -p 128 -n 32 -r 2
    python bench/bench_prediction.py --calibrate         # also print the constants implied

The machine's read bandwidth is probed again first (bandwidth_probe.read_bandwidth with
remeasure: the better of the cached and the new value is kept), and the load average is printed
before and after: on a shared machine other programs slow the measurement, not the prediction.
The prediction is made for what the bench runs: n_ctx = n_prompt + 16 (memory), an n_prompt
token prefill, and decode at the middle of the n_gen tokens it generates from an empty cache.
Memory is compared with the bench's peak RSS. Speeds measured are the best of the timed runs
(-r) over --rounds sweeps of all the models, for the same reason the probe keeps its best
pass: other programs only ever slow a run down, and the prediction is for this machine
running the model alone.

--calibrate prints, per model, the decode efficiency and prefill multiply-adds per thread that
would make its prediction exact: for a model of repacked types only (one shared constant), and
for each other type the value that explains the rest of its time once the repacked tensors take
their share (the SmolLM2 quant variants hold one tensor group of each such type). That is how
the constants in run_prediction.py were set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = Path.home() / ".cache" / "localchat-tests" / "quant-variants-v1"
QWEN = Path.home() / ".cache" / "LocalChat" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
REPACKED = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "F32"})


def default_models() -> list[Path]:
    from engine.model_files import default_model_path, gemma3_270m_path

    models = [default_model_path(), gemma3_270m_path()]
    if QWEN.is_file():
        models.append(QWEN)
    for variant in ("IQ4_XS", "IQ2_XS", "TQ2_0", "MXFP4"):
        path = VARIANTS / f"smollm2-{variant}.gguf"
        if path.is_file():
            models.append(path)
    return models


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(path: Path, args) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "bench",
        str(path),
        "-p",
        str(args.n_prompt),
        "-n",
        str(args.n_gen),
        "-r",
        str(args.repetitions),
        "--skip-cold",
        "--json",
    ]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def error(predicted: float, measured: float) -> float:
    return 100 * (predicted - measured) / measured


def implied_constants(path: Path, measured: dict, machine, args) -> str:
    """The decode efficiency and prefill MACs per thread that make this model's prediction
    exact (see the module docstring)."""
    from engine import run_prediction as rp
    from engine.config import ModelConfig
    from engine.gguf import open_gguf
    from engine.kv_cache import KVCache

    g = open_gguf(path, skip_string_arrays=True)
    config = ModelConfig.from_gguf(g)
    bw = machine.bandwidth_bytes_per_s
    read = rp.decode_bytes_by_type(g.tensors)
    macs = rp.prefill_macs_by_type(g.tensors)
    kv = KVCache.bytes_needed(config, 1, "f16") * (args.n_gen // 2)
    decode_s = 1 / measured["decode_tok_s"] - kv / (bw * rp.VNNI_DECODE_EFFICIENCY["Q8_0"])
    attn = 2 * config.n_layers * config.n_head * config.head_dim * (args.n_prompt / 2)
    prefill_s = 1 / measured["prefill_tok_s"]
    others = [q for q in read if q not in REPACKED]
    if not others:
        eff = sum(read.values()) / (bw * decode_s)
        rate = (sum(macs.values()) + attn) / prefill_s / machine.threads
        return f"repacked: decode efficiency {eff:.3f}, prefill {rate / 1e9:.1f} G MAC/s/thread"
    parts = []
    for q in others:  # the rest at the table's constants
        rest_d = sum(b / (bw * rp.VNNI_DECODE_EFFICIENCY[t]) for t, b in read.items() if t != q)
        rest_p = sum(
            m / (rp.VNNI_PREFILL_MACS_PER_THREAD[t] * machine.threads)
            for t, m in macs.items()
            if t != q
        ) + attn / (rp.VNNI_PREFILL_MACS_PER_THREAD["Q8_0"] * machine.threads)
        eff = read[q] / (bw * max(decode_s - rest_d, 1e-9))
        rate = macs.get(q, 0) / max(prefill_s - rest_p, 1e-9) / machine.threads
        parts.append(f"{q}: decode efficiency {eff:.3f}, prefill {rate / 1e9:.1f} G MAC/s/thread")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("-p", "--n-prompt", type=int, default=128)
    parser.add_argument("-n", "--n-gen", type=int, default=32)
    parser.add_argument("-r", "--repetitions", type=int, default=2)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2, help="sweeps over the models")
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args(argv)

    from engine.bandwidth_probe import machine_key, read_bandwidth
    from engine.run_prediction import Machine, planned_path, predict_file

    threads, kernel_path, cpu = planned_path(args.threads)
    bandwidth = read_bandwidth(machine_key(threads, kernel_path, cpu), remeasure=True)
    machine = Machine(threads, kernel_path, bandwidth.bytes_per_s, None)
    print(
        f"read bandwidth {bandwidth.gb_per_s:.1f} GB/s ({threads} threads, {kernel_path}, "
        f"CPU {cpu or '?'}); load average {load_average()}"
    )
    rows = []
    header = (
        "| model | decode pred | decode meas | err | prefill pred | prefill meas | err "
        "| memory pred | peak RSS | err |"
    )
    print(header)
    print("|---" * 10 + "|")
    models = args.models or default_models()
    best: dict[Path, dict] = {}
    for round_no in range(args.rounds):
        # whole sweeps, so a busy minute on a shared machine hits one model's run, not all of
        # one model's runs; each model keeps its best run over the rounds
        for path in models:
            m = measure(path, args)
            kept = best.setdefault(path, m)
            kept["decode_tok_s"] = max(max(m["decode_runs"]), kept.get("best_decode", 0.0))
            kept["prefill_tok_s"] = max(max(m["prefill_runs"]), kept.get("best_prefill", 0.0))
            kept["best_decode"], kept["best_prefill"] = kept["decode_tok_s"], kept["prefill_tok_s"]
            kept["peak_rss_mb"] = min(kept["peak_rss_mb"], m["peak_rss_mb"])
        print(f"round {round_no + 1}: load average {load_average()}", file=sys.stderr, flush=True)
    # probe again after the sweeps (the better value is kept), in case the first was unlucky
    bandwidth = read_bandwidth(machine_key(threads, kernel_path, cpu), remeasure=True)
    machine = Machine(threads, kernel_path, bandwidth.bytes_per_s, None)
    print(f"read bandwidth used: {bandwidth.gb_per_s:.1f} GB/s")
    for path in models:
        p = predict_file(
            path,
            n_ctx=args.n_prompt + 16,
            machine=machine,
            n_prompt=args.n_prompt,
            position=args.n_gen // 2,
        )
        m = best[path]
        row = (
            path.name,
            p.decode_tok_s,
            m["decode_tok_s"],
            error(p.decode_tok_s, m["decode_tok_s"]),
            p.prefill_tok_s,
            m["prefill_tok_s"],
            error(p.prefill_tok_s, m["prefill_tok_s"]),
            p.memory_mb,
            m["peak_rss_mb"],
            error(p.memory_mb, m["peak_rss_mb"]),
        )
        rows.append(row)
        print(
            "| {} | {:.1f} | {:.1f} | {:+.0f}% | {:.0f} | {:.0f} | {:+.0f}% | {:.0f} MiB "
            "| {:.0f} MiB | {:+.0f}% |".format(*row),
            flush=True,
        )
        if args.calibrate:
            print(f"    implied: {implied_constants(path, m, machine, args)}", flush=True)
    worst = max(abs(r[3]) for r in rows)
    print(
        f"\nworst decode error {worst:.0f}% over {len(rows)} models; load average {load_average()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
