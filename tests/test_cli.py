"""The command line (`python -m engine ...`) on a tiny random llama with SmolLM2's tokenizer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return str(
        write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny-llama.gguf", "llama", seed=3)
    )


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tokenize_json_ids_and_pieces(capsys, tiny):
    code, out, _ = run_cli(capsys, "tokenize", tiny, "Hello<|im_start|> world", "--json")
    record = json.loads(out)
    assert code == 0
    assert record["ids"].count(1) == 1  # <|im_start|> (id 1) is one token
    assert record["pieces"][record["ids"].index(1)] == "<|im_start|>"
    assert "".join(record["pieces"]) == "Hello<|im_start|> world"


def test_tokenize_no_special_adds_nothing_but_still_parses_specials(capsys, tiny):
    _, with_special, _ = run_cli(capsys, "tokenize", tiny, "<|im_end|>", "--json")
    _, without, _ = run_cli(capsys, "tokenize", tiny, "<|im_end|>", "--json", "--no-special")
    assert json.loads(without)["ids"] == [2]
    assert json.loads(with_special)["ids"][-1] == 2


def test_score_gives_each_token_its_own_logprob_the_total_and_perplexity(capsys, tiny):
    import math

    from engine.loader import load_model
    from engine.sampling import log_softmax

    text = "The cat sat on the mat"
    code, out, _ = run_cli(capsys, "score", tiny, text, "--top", 4, "--json")
    assert code == 0
    result = json.loads(out)
    positions = result["positions"]
    lm = load_model(tiny)
    ids = lm.tokenizer.encode(text, add_special=True)
    assert [p["token_id"] for p in positions] == ids
    assert positions[0]["logprob"] is None and positions[0]["top"] == []  # no context yet
    own = []
    for i in range(1, len(ids)):
        # token i is scored by the model's output after ids[:i], computed here independently
        lp = log_softmax(lm.model.forward(ids[:i], lm.model.new_cache(i)))
        own.append(float(lp[ids[i]]))
        assert positions[i]["logprob"] == pytest.approx(own[-1], abs=2e-3)
        top = positions[i]["top"]
        assert len(top) == 4 and top[0]["id"] == int(lp.argmax())
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        for t in top:
            assert t["logprob"] == pytest.approx(float(lp[t["id"]]), abs=2e-3)
    assert result["scored_tokens"] == len(ids) - 1
    assert result["total_logprob"] == pytest.approx(sum(own), abs=1e-2)
    assert result["perplexity"] == pytest.approx(math.exp(-sum(own) / len(own)), rel=1e-3)
    full = log_softmax(lm.model.forward(ids, lm.model.new_cache(len(ids))))
    assert result["next_top"][0]["id"] == int(full.argmax())


def test_score_text_output_needs_no_top_and_prints_the_total(capsys, tiny):
    code, out, err = run_cli(capsys, "score", tiny, "The cat sat")
    assert code == 0, err
    assert "total logprob" in out and "perplexity" in out
    rows = [line for line in out.splitlines()[1:] if not line.startswith("total")]
    assert all(len(row.split("  ")) > 3 for row in rows[1:])  # default --top gives candidates


@pytest.mark.parametrize(
    "flags,field",
    [
        (["--top-p", "1.5"], "top_p"),
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "0", "--sample"], "temperature"),
        (["--top-k", "-3"], "top_k"),
        (["--repeat-penalty", "0"], "repetition_penalty"),
        (["--max-tokens", "0"], "max_new_tokens"),
        (["--min-p", "nan"], "min_p"),
    ],
)
def test_invalid_generate_values_exit_nonzero_with_the_message_on_stderr(
    capsys, tiny, flags, field
):
    code, out, err = run_cli(capsys, "generate", tiny, "Hi", *flags)
    assert code == 2
    assert field in err and "must be" in err
    assert out == ""


def test_context_overflow_is_reported_not_crashed(capsys, tiny):
    code, _, err = run_cli(capsys, "generate", tiny, "Hi", "--max-tokens", 10**6, "--n-ctx", 64)
    assert code == 1 and "context window" in err
    # named as the flag the user typed, not the engine's field
    assert "--max-tokens (1000000)" in err and "max_new_tokens" not in err


def test_missing_model_file_is_a_usage_error_naming_the_path_once(capsys, tmp_path):
    code, _, err = run_cli(capsys, "tokenize", tmp_path / "nope.gguf", "x")
    assert code == 2 and err.count("nope.gguf") == 1 and "not found" in err


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "engine", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0
    for command in ("info", "tokenize", "generate", "score"):
        assert command in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    for flag in (
        "--temperature",
        "--top-k",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--repeat-last-n",
        "--presence-penalty",
        "--frequency-penalty",
        "--seed",
        "--max-tokens",
        "--stop",
        "--system",
        "--chat",
        "--json",
    ):
        assert flag in result.stdout


def _generate_json(capsys, tiny, *flags):
    code, out, err = run_cli(capsys, "generate", tiny, "Once upon a time", "--json", *flags)
    assert code == 0, err
    return json.loads(out)


def test_generate_json_record_has_ids_text_reason_usage_and_preset(capsys, tiny):
    record = _generate_json(capsys, tiny, "--max-tokens", 6, "--temperature", 0)
    assert set(record) >= {"ids", "text", "finish_reason", "usage", "preset"}
    assert record["finish_reason"] in ("length", "stop") and len(record["ids"]) <= 6
    usage = record["usage"]
    assert usage["prompt_tokens"] > 0 and usage["ttft_ms"] >= usage["prefill_ms"]
    preset = record["preset"]
    assert (
        preset["sources"]["max_new_tokens"] == "override"
        and preset["values"]["max_new_tokens"] == 6
    )
    assert preset["values"]["do_sample"] is False and preset["sources"]["do_sample"] == "override"
    assert preset["sources"]["top_p"] == "default"


def test_streamed_text_equals_the_json_text(capsys, tiny):
    record = _generate_json(capsys, tiny, "--max-tokens", 8, "--greedy")
    code, out, _ = run_cli(
        capsys, "generate", tiny, "Once upon a time", "--max-tokens", 8, "--greedy"
    )
    assert code == 0 and out == record["text"] + "\n"


def test_seeded_sampling_from_the_cli_repeats(capsys, tiny):
    flags = (
        "--max-tokens",
        6,
        "--temperature",
        0.9,
        "--top-k",
        20,
        "--top-p",
        0.9,
        "--min-p",
        0.01,
        "--repeat-penalty",
        1.1,
        "--repeat-last-n",
        16,
        "--presence-penalty",
        0.2,
        "--frequency-penalty",
        0.1,
        "--seed",
        5,
    )
    a, b = _generate_json(capsys, tiny, *flags), _generate_json(capsys, tiny, *flags)
    assert a["ids"] == b["ids"]
    values, sources = a["preset"]["values"], a["preset"]["sources"]
    assert values["do_sample"] is True and values["seed"] == 5 and a["preset"]["seed_used"] == 5
    for field in (
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "max_new_tokens",
    ):
        assert sources[field] == "override", field


def test_stop_flag_cuts_before_the_stop_string(capsys, tiny):
    text = _generate_json(capsys, tiny, "--max-tokens", 12, "--greedy")["text"]
    assert len(text) >= 4
    stop = text[2:4]
    cut = _generate_json(
        capsys, tiny, "--max-tokens", 12, "--greedy", "--stop", stop, "--stop", "\x00never"
    )
    assert cut["finish_reason"] == "stop_sequence"
    assert cut["text"] == text[: text.find(stop)]


def test_chat_with_system_prompt_uses_the_template(capsys, tiny):
    plain = _generate_json(capsys, tiny, "--max-tokens", 2)
    chat = _generate_json(capsys, tiny, "--max-tokens", 2, "--chat", "--system", "Be brief.")
    assert chat["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 5


def test_system_without_chat_is_rejected(capsys, tiny):
    code, _, err = run_cli(capsys, "generate", tiny, "Hi", "--system", "x")
    assert code == 2 and "--chat" in err


def test_info_json_reports_model_tokenizer_template_and_preset_sources(capsys, tiny):
    code, out, _ = run_cli(capsys, "info", tiny, "--json")
    info = json.loads(out)
    assert code == 0
    assert info["architecture"] == "llama" and info["layers"] >= 1 and info["parameters"] > 0
    assert info["tokenizer"]["eog_ids"] and 2 in info["tokenizer"]["eog_ids"]  # <|im_end|>
    assert info["quant_mix"]["F32"]["tensors"] > 0
    assert info["chat_template"]["name"]
    assert set(info["preset"]["sources"].values()) == {"default"}
    assert set(info["preset"]["values"]) >= {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "stop",
    }


def test_top_logprobs_shows_alternatives_in_json_and_text(capsys, tiny):
    record = _generate_json(capsys, tiny, "--max-tokens", 4, "--greedy", "--top-logprobs", 3)
    tokens = record["tokens"]
    assert [t["id"] for t in tokens] == record["ids"]
    for t in tokens:
        assert len(t["top"]) == 3
        assert t["top"][0]["id"] == t["id"]  # greedy: the chosen token is the most likely
        assert t["top"][0]["logprob"] == pytest.approx(t["logprob"])
    code, out, _ = run_cli(
        capsys,
        "generate",
        tiny,
        "Once upon a time",
        "--max-tokens",
        4,
        "--greedy",
        "--top-logprobs",
        3,
    )
    assert code == 0
    table = out.split("token alternatives", 1)[1].splitlines()[1:]
    assert len(table) == len(tokens)
    assert repr(tokens[0]["top"][1]["text"]) in table[0]


def test_threads_above_the_pool_limit_are_refused_not_run_on_numpy(capsys, tiny):
    code, out, err = run_cli(capsys, "generate", tiny, "Hi", "--threads", 300, "--max-tokens", 1)
    assert code == 2 and "256" in err and out == ""
    assert "numpy" not in err


def test_help_documents_the_exit_codes():
    result = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "exit codes" in result.stdout
    for code in ("0 ", "1 ", "2 ", "130"):
        assert f"\n  {code}" in result.stdout


@pytest.fixture(scope="module")
def tiny_without_template(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    path = tmp_path_factory.mktemp("cli") / "tiny-base.gguf"
    return str(write_tiny_model(path, "llama", seed=3, omit_keys=("tokenizer.chat_template",)))


def test_info_marks_a_fallback_template_once(capsys, tiny_without_template):
    code, out, _ = run_cli(capsys, "info", tiny_without_template)
    line = next(line for line in out.splitlines() if line.startswith("chat template"))
    assert code == 0 and line.count("fallback") == 1


def test_info_names_the_kernel_path(capsys, tiny, monkeypatch):
    code, out, _ = run_cli(capsys, "info", tiny)
    assert code == 0 and any(line.startswith("kernels          JIT") for line in out.splitlines())
    monkeypatch.setenv("LOCALCHAT_KERNELS", "numpy")
    _, out, _ = run_cli(capsys, "info", tiny, "--json")
    assert json.loads(out)["kernels"] == "numpy (LOCALCHAT_KERNELS=numpy)"


def test_chat_on_a_model_without_template_warns_it_is_a_base_model(capsys, tiny_without_template):
    code, _, err = run_cli(
        capsys, "generate", tiny_without_template, "Hi", "--chat", "--max-tokens", 1
    )
    assert code == 0 and "no chat template" in err and "base model" in err
    _, _, plain = run_cli(capsys, "generate", tiny_without_template, "Hi", "--max-tokens", 1)
    assert "base model" not in plain


def test_chat_on_a_model_with_a_template_does_not_warn(capsys, tiny):
    code, _, err = run_cli(capsys, "generate", tiny, "Hi", "--chat", "--max-tokens", 1)
    assert code == 0 and "base model" not in err


def test_a_fallback_to_numpy_kernels_is_one_plain_warning_line(capsys, tiny, monkeypatch):
    import warnings

    import engine.kernels.jit_backend as jit_backend

    def no_jit(*args, **kwargs):
        raise RuntimeError("no LLVM target here")

    monkeypatch.setattr(jit_backend, "JitBackend", no_jit)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # whatever the suite's filters say, show it like a user
        code, _, err = run_cli(capsys, "generate", tiny, "Hi", "--max-tokens", 1)
    assert code == 0
    warning_lines = [line for line in err.splitlines() if "numpy kernels" in line]
    assert warning_lines == [
        "warning: JIT kernels unavailable (RuntimeError: no LLVM target here); using numpy kernels"
    ]
    assert ".py:" not in err  # no source path, no source line
