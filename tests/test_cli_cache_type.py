"""--cache-type on the CLI: q8_0 runs (a tiny model with 32-value heads), an unknown type is a
usage error naming it, `info` reports the KV cache size per type, `bench --json` says which."""

import json

import pytest

from engine.__main__ import main


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    path = tmp_path_factory.mktemp("cli_kv") / "tiny-qwen2.gguf"
    return str(write_tiny_model(path, "qwen2", seed=4, head_dim=32, d_model=64))


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_over_a_q8_0_cache(capsys, tiny32):
    code, out, err = run_cli(
        capsys, "generate", tiny32, "hi", "--max-tokens", "3", "--greedy", "--json",
        "--cache-type", "q8_0",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["usage"]["completion_tokens"] == 3


def test_unknown_cache_type_is_refused_naming_it(capsys, tiny32):
    code, _, err = run_cli(capsys, "generate", tiny32, "hi", "--cache-type", "q4_bogus")
    assert code == 2
    assert "cache_type='q4_bogus'" in err and "f16, q8_0" in err


def test_info_reports_kv_cache_size_per_type(capsys, tiny32):
    code, out, _ = run_cli(capsys, "info", tiny32, "--json")
    assert code == 0
    sizes = json.loads(out)["kv_cache_mib"]
    assert set(sizes) == {"f16", "q8_0"}
    assert sizes["q8_0"] == pytest.approx(sizes["f16"] * 34 / 64, abs=0.1)


def test_bench_json_names_the_cache_type(capsys, tiny32):
    argv = ["bench", tiny32, "-p", "8", "-n", "4", "-r", "1", "--skip-cold", "--json"]
    code, out, err = run_cli(capsys, *argv, "--cache-type", "q8_0")
    assert code == 0, err
    assert json.loads(out)["cache_type"] == "q8_0"
