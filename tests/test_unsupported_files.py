"""Files the engine cannot run: the refusal names what is missing (the architecture, or the
tensor and its type) before any weight is read, the same words in the CLI and the app's load
dialog, and `info` still describes the file with `supported: no (reason)`."""

import json

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from engine.__main__ import main
from engine.errors import UnsupportedModelError
from engine.gguf import SUPPORTED_QTYPES, open_gguf
from engine.loader import load_model
from tests.tiny_models import write_tiny_model


def _copy(source, path, *, arch=None, retype=None):
    """`source` written again, optionally under another architecture name (its keys renamed)
    or with one tensor stored in another block type ({name: qtype}, raw random blocks)."""
    g = open_gguf(source)
    arch = arch or g.arch
    writer = GGUFWriter(path, arch)
    for key, value in g.metadata.items():
        if key in ("general.architecture", "GGUF.kv_count"):
            continue
        vtype = g.metadata_types[key]
        name = key.replace(f"{g.arch}.", f"{arch}.", 1) if key.startswith(g.arch + ".") else key
        writer.add_key_value(name, value, vtype.type, vtype.element_type)
    for name, t in g.tensors.items():
        qtype = (retype or {}).get(name)
        if qtype is None:
            writer.add_tensor(name, np.array(t.data))
            continue
        block, size = GGML_QUANT_SIZES[qtype]
        rows, cols = t.shape
        raw = np.zeros((rows, cols // block * size), np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _unsupported_type() -> GGMLQuantizationType:
    """A block type gguf-py knows and the engine does not run (whichever that is today)."""
    for qtype in GGMLQuantizationType:
        block, _ = GGML_QUANT_SIZES.get(qtype, (0, 0))
        if qtype not in SUPPORTED_QTYPES and block and 256 % block == 0:
            return qtype
    pytest.skip("every gguf-py block type is supported")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("unsupported")
    source = write_tiny_model(d / "tiny.gguf", "llama", d_model=256, head_dim=64, d_ff=256)
    qtype = _unsupported_type()
    return dict(
        supported=source,
        arch=_copy(source, d / "deepseek2.gguf", arch="deepseek2"),
        qtype=_copy(source, d / "qtype.gguf", retype={"blk.0.ffn_down.weight": qtype}),
        qtype_name=qtype.name,
    )


ARCH_REFUSAL = "architecture 'deepseek2' is not supported; supported: llama, mistral3, qwen2"


def test_refusals_name_the_architecture_or_the_tensor_and_its_type(files):
    with pytest.raises(UnsupportedModelError, match=ARCH_REFUSAL):
        load_model(files["arch"])
    with pytest.raises(UnsupportedModelError) as refused:
        load_model(files["qtype"])
    assert "'blk.0.ffn_down.weight'" in str(refused.value)
    assert files["qtype_name"] in str(refused.value)


def test_refusal_comes_before_any_weight_is_read(files, monkeypatch):
    """No model is built and nothing dequantized: the refusal is from the header and config."""
    import engine.loader
    import engine.models.transformer as transformer

    def forbidden(*args, **kwargs):
        raise AssertionError("a weight was read for a file that is refused")

    monkeypatch.setattr(transformer, "dequantize_full", forbidden)
    monkeypatch.setattr(engine.loader, "build_model", forbidden)
    for name in ("arch", "qtype"):
        with pytest.raises(UnsupportedModelError):
            load_model(files[name])


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_info_says_whether_the_file_is_supported_and_why_not(capsys, files):
    code, out, _ = _cli(capsys, "info", files["supported"])
    assert code == 0 and "supported        yes" in out.splitlines()
    code, out, _ = _cli(capsys, "info", files["arch"])
    line = next(line for line in out.splitlines() if line.startswith("supported"))
    assert code == 0 and line.startswith(f"supported        no ({ARCH_REFUSAL}")
    assert "architecture     deepseek2" in out
    code, out, _ = _cli(capsys, "info", files["qtype"], "--json")
    info = json.loads(out)
    assert code == 0 and info["supported"] is False
    assert "blk.0.ffn_down.weight" in info["unsupported_reason"]
    assert files["qtype_name"] in info["unsupported_reason"]
    assert list(info["unsupported_tensors"]) == ["blk.0.ffn_down.weight"]
    assert info["layers"] is None  # no config for a file that will not load
    assert json.loads(_cli(capsys, "info", files["supported"], "--json")[1])["supported"] is True


def test_generate_refuses_with_the_same_message_and_exit_code_1(capsys, files):
    code, _, err = _cli(capsys, "generate", files["arch"], "Hi", "--max-tokens", 1)
    assert code == 1 and ARCH_REFUSAL in err


def test_the_app_load_dialog_shows_the_engines_refusal(qtbot, files):
    from app.controller import EngineController
    from app.engine_bridge import RealEngine
    from tests.app_fakes import WAIT_MS

    controller = EngineController(RealEngine())
    try:
        for name in ("arch", "qtype"):
            with qtbot.waitSignal(controller.loadFailed, timeout=WAIT_MS) as failed:
                controller.load_model(str(files[name]))
            path, message = failed.args
            assert path == str(files[name])
            if name == "arch":
                assert ARCH_REFUSAL in message
            else:
                assert "blk.0.ffn_down.weight" in message and files["qtype_name"] in message
    finally:
        controller.shutdown()
