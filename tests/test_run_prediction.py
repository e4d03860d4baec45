"""Will it run here? (engine/run_prediction.py, engine/bandwidth_probe.py, `engine info`):
memory from the tensor table by hand-computed cases, the speed formula, the probe's cache, the
JSON shape. Tiny GGUF files written with gguf-py; no model is loaded."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine import bandwidth_probe as bp
from engine import run_prediction as rp
from engine.errors import ConfigValidationError, UnsupportedModelError
from tests.tiny_models import Q, write_tiny_model

MACHINE = rp.Machine(
    threads=2, kernel_path="vnni", bandwidth_bytes_per_s=10e9, available_bytes=None
)


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    """llama, 2 layers, d_model 64, 4 heads / 2 KV heads of 16, d_ff 128, vocab 256, untied,
    every tensor F32. Per layer: norms 2 x 256 B, q 64x64x4 = 16384, k and v 32x64x4 = 8192,
    o 16384, gate/up/down 128x64x4 = 32768 each: 147,968 B. Plus output_norm 256 B, output
    256x64x4 = 65,536 B, token_embd 65,536 B (untied: left out of memory and decode reads)."""
    return write_tiny_model(
        tmp_path_factory.mktemp("pred") / "f32.gguf",
        "llama",
        Q.F32,
        n_layers=2,
        tokenizer=None,
        vocab_size=256,
        tie_embeddings=False,
        n_ctx_train=2048,
    )


@pytest.fixture(scope="module")
def q4k_model(tmp_path_factory):
    """llama, 1 layer, d_model 256, 4 heads of 64, 2 KV heads, d_ff 256, vocab 256, tied,
    2-D weights Q4_K (one 256-value super-block per row, 144 B in the file)."""
    return write_tiny_model(
        tmp_path_factory.mktemp("pred") / "q4k.gguf",
        "llama",
        Q.Q4_K,
        n_layers=1,
        tokenizer=None,
        vocab_size=256,
        d_model=256,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        d_ff=256,
        tie_embeddings=True,
    )


F32_WEIGHTS = 2 * 147_968 + 256 + 65_536  # = 361,728: token_embd (untied) not counted


def test_memory_of_an_f32_model_is_weights_plus_exact_kv_plus_overhead(f32_model):
    p = rp.predict_file(f32_model, n_ctx=100, cache_type="f16", machine=MACHINE)
    assert p.weights_bytes == 361_728 == F32_WEIGHTS
    # K and V x 2 layers x 100 positions x 2 KV heads x 16 dims x 2 bytes (f16)
    assert p.kv_bytes == 2 * 2 * 100 * 2 * 16 * 2 == 25_600
    assert p.overhead_bytes == rp.OVERHEAD_BASE_BYTES + rp.OVERHEAD_PER_VOCAB_BYTES * 256
    assert p.memory_bytes == 361_728 + 25_600 + p.overhead_bytes
    assert p.n_ctx == 100 and p.threads == 2 and p.uncalibrated == ()


def test_context_default_and_clamp_follow_the_loader(f32_model):
    # no n_ctx: min(trained 2048, loader default 4096) = 2048; 10,000 is clamped to 2048
    assert rp.predict_file(f32_model, machine=MACHINE).kv_bytes == 2 * 2 * 2048 * 2 * 16 * 2
    assert rp.predict_file(f32_model, n_ctx=10_000, machine=MACHINE).n_ctx == 2048
    with pytest.raises(ConfigValidationError, match="n_ctx"):
        rp.predict_file(f32_model, n_ctx=0, machine=MACHINE)
    with pytest.raises(ConfigValidationError, match="cache_type"):
        rp.predict_file(f32_model, cache_type="q3", machine=MACHINE)


def test_repacked_weights_count_at_record_size(q4k_model):
    """A Q4_K record holds 16 rows of one super-block in 2368 B (the file: 16 x 144 = 2304).
    Rows: q 256, k 128, v 128, o 256, gate/up/down 256 each, tied token_embd 256 (the output
    projection: repacked, counted once) -> 6 x 16 + 2 x 8 = 112 records; norms 3 x 1024 B."""
    p = rp.predict_file(q4k_model, n_ctx=64, machine=MACHINE)
    assert p.weights_bytes == 112 * 2368 + 3 * 1024 == 268_288


def test_decode_and_prefill_speed_by_hand(f32_model):
    """Decode at 10 GB/s, F32 efficiency 0.42 (4.2 GB/s): weights 361,728 B (no token_embd)
    + the KV cache of 256 positions x 256 B (2 x 2 layers x 2 heads x 16 x 2 B) = 65,536 B
    -> 427,264 B / 4.2e9 B/s = 101.73 us -> 9,830.0 tok/s. Prefill per token at 94 G MAC/s per
    thread x 2 threads: 2 layers x (64x64 + 2 x 32x64 + 64x64 + 3 x 128x64) = 73,728 MACs +
    attention 2 x 2 layers x 4 heads x 16 x 256 = 65,536 -> 139,264 / 188e9 -> 1,349,954."""
    p = rp.predict_file(f32_model, n_ctx=512, machine=MACHINE)
    assert p.decode_tok_s == pytest.approx(4.2e9 / 427_264, rel=1e-9)
    assert p.decode_tok_s == pytest.approx(9_830.0, abs=0.1)
    assert p.prefill_tok_s == pytest.approx(188e9 / 139_264, rel=1e-9)
    assert p.prefill_tok_s == pytest.approx(1_349_954, abs=1)
    slower = rp.predict_file(f32_model, machine=replace(MACHINE, kernel_path="generic"))
    assert slower.decode_tok_s == pytest.approx(p.decode_tok_s * 0.25, rel=1e-9)


def test_fits_against_free_memory_and_the_library_line(f32_model):
    roomy = rp.predict_file(f32_model, n_ctx=100, machine=replace(MACHINE, available_bytes=10**10))
    assert roomy.fits is True
    # 361,728 + 25,600 + 121 MiB + 444 x 256 = 127,378,688 B
    assert roomy.memory_bytes == 127_378_688
    assert roomy.summary() == "needs ~0.1 GB of 10.0 GB free · ~9830 tok/s"
    tight = rp.predict_file(f32_model, n_ctx=100, machine=replace(MACHINE, available_bytes=10**6))
    assert tight.fits is False
    assert rp.predict_file(f32_model, machine=MACHINE).fits is None  # free memory unknown


def test_summary_wording():
    p = rp.RunPrediction(
        path="m.gguf",
        n_ctx=4096,
        cache_type="f16",
        threads=2,
        kernel_path="vnni",
        weights_bytes=1_000_000_000,
        kv_bytes=200_000_000,
        overhead_bytes=100_000_000,
        available_bytes=9_800_000_000,
        decode_tok_s=29.6,
        prefill_tok_s=300.0,
        bandwidth_bytes_per_s=3e10,
    )
    assert p.summary() == "needs ~1.3 GB of 9.8 GB free · ~30 tok/s"
    assert rp.prediction_error(27.1, 29.0) == "+7%"
    assert rp.prediction_error(30.0, 24.0) == "-20%"


def test_unsupported_file_raises_the_loaders_error(tmp_path):
    path = write_tiny_model(
        tmp_path / "odd.gguf",
        "llama",
        Q.F32,
        tokenizer=None,
        vocab_size=256,
        n_layers=1,
        extra_metadata={
            "general.architecture": ("not-an-arch", __import__("gguf").GGUFValueType.STRING)
        },
    )
    with pytest.raises(UnsupportedModelError):
        rp.predict_file(path, machine=MACHINE)


def test_bad_thread_count_is_refused_before_any_probe():
    for bad in (0, -1, 257, 2.5, True):
        with pytest.raises(ConfigValidationError, match="n_threads"):
            rp.planned_path(bad)
    assert rp.planned_path(3)[0] in (1, 3)  # 1 on the numpy path, which runs one thread


# --- the bandwidth probe's cache ------------------------------------------------------------


class CountingProbe:
    def __init__(self, *rates: float):
        self.rates = list(rates)
        self.calls: list[int] = []

    def __call__(self, threads: int) -> tuple[float, float]:
        self.calls.append(threads)
        return self.rates.pop(0), 0.01


def key(**changes) -> bp.MachineKey:
    base = bp.MachineKey("Test CPU 9000", "rocketlake", 2, "vnni")
    return replace(base, **changes)


def test_probe_is_cached_per_machine_and_measured_again_when_it_changes(tmp_path):
    cache = tmp_path / "data" / "bandwidth_probe.json"
    probe = CountingProbe(20e9, 30e9, 40e9, 50e9)
    first = bp.read_bandwidth(key(), cache, measure=probe)
    assert first.bytes_per_s == 20e9 and not first.cached and probe.calls == [2]
    again = bp.read_bandwidth(key(), cache, measure=probe)
    assert again.bytes_per_s == 20e9 and again.cached and probe.calls == [2]
    moved = bp.read_bandwidth(key(cpu_model="Other CPU"), cache, measure=probe)  # new machine
    assert moved.bytes_per_s == 30e9 and probe.calls == [2, 2]
    fewer = bp.read_bandwidth(key(cpu_model="Other CPU", threads=1), cache, measure=probe)
    assert fewer.bytes_per_s == 40e9 and probe.calls == [2, 2, 1]
    path_changed = bp.read_bandwidth(
        key(cpu_model="Other CPU", threads=1, kernel_path="avx2"), cache, measure=probe
    )
    assert path_changed.bytes_per_s == 50e9 and len(probe.calls) == 4


def test_damaged_cache_is_measured_over_and_remeasure_keeps_the_better(tmp_path):
    cache = tmp_path / "bandwidth_probe.json"
    cache.write_text("{not json", encoding="utf-8")
    probe = CountingProbe(20e9, 10e9, 30e9)
    assert bp.read_bandwidth(key(), cache, measure=probe).bytes_per_s == 20e9
    assert json.loads(cache.read_text())["bytes_per_s"] == 20e9
    # a probe taken while the machine was busy reads low: the better one stays
    assert bp.read_bandwidth(key(), cache, measure=probe, remeasure=True).bytes_per_s == 20e9
    assert bp.read_bandwidth(key(), cache, measure=probe, remeasure=True).bytes_per_s == 30e9
    assert bp.read_bandwidth(key(), cache, measure=probe).bytes_per_s == 30e9


def test_unwritable_cache_costs_only_the_next_probe(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    probe = CountingProbe(20e9, 20e9)
    assert bp.read_bandwidth(key(), blocker / "sub" / "c.json", measure=probe).bytes_per_s == 20e9
    assert bp.read_bandwidth(key(), blocker / "sub" / "c.json", measure=probe).bytes_per_s == 20e9
    assert len(probe.calls) == 2


def test_real_probe_is_short_and_positive():
    rate, seconds = bp.measure_read_bandwidth(1, nbytes=8 * 2**20, seconds=0.05)
    assert rate > 0 and seconds < 0.5


# --- `python -m engine info` ----------------------------------------------------------------


@pytest.fixture(scope="module")
def f32_chat_model(tmp_path_factory):
    """The f32 model with SmolLM2's tokenizer (49152 tokens), which `info` needs."""
    return write_tiny_model(
        tmp_path_factory.mktemp("pred") / "f32chat.gguf",
        "llama",
        Q.F32,
        n_layers=2,
        tie_embeddings=False,
    )


def test_info_json_has_the_prediction(f32_chat_model, tmp_path, monkeypatch, capsys):
    from engine.__main__ import main

    f32_model = f32_chat_model
    monkeypatch.setenv(bp.BANDWIDTH_CACHE_ENV, str(tmp_path / "bw.json"))
    monkeypatch.setattr(bp, "measure_read_bandwidth", lambda threads: (12e9, 0.01))
    assert main(["info", str(f32_model), "--json", "--n-ctx", "100", "--threads", "1"]) == 0
    predicted = json.loads(capsys.readouterr().out)["predicted"]
    assert {"memory_mb", "prefill_tok_s", "decode_tok_s", "threads"} <= set(predicted)
    assert predicted["threads"] == 1
    # weights: the f32 model's with a 49152-row output (49152 x 64 x 4 B) instead of 256 rows
    weights = 2 * 147_968 + 256 + 49152 * 64 * 4
    overhead = 121 * 2**20 + 444 * 49152
    assert predicted["memory_mb"] == pytest.approx((weights + 25_600 + overhead) / 2**20, abs=0.05)
    assert predicted["decode_tok_s"] > 0 and predicted["prefill_tok_s"] > 0
    assert main(["info", str(f32_model), "--n-ctx", "100"]) == 0
    text = capsys.readouterr().out
    assert "predicted" in text and "needs ~" in text and "decode ~" in text
