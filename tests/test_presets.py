"""Preset resolution (priority, provenance, absent-field rule) and GenerationConfig validation."""

import json
import math

import pytest
from fake_model import FakeGGUF, fake_lm, script_tokens

from engine.errors import ConfigValidationError, PresetFileError
from engine.generation_config import MAX_NEW_TOKENS_LIMIT, GenerationConfig
from engine.presets import gguf_sampling_values, resolve_preset


def lm_at(tmp_path, metadata=None, name="model.gguf"):
    gguf_path = tmp_path / name
    gguf_path.write_bytes(b"")  # only its location matters to preset resolution
    return fake_lm(script_tokens(0, []), path=gguf_path, gguf=FakeGGUF(metadata or {}))


# --- validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("temperature", "hot"),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 1.5),
        ("top_p", -0.01),
        ("min_p", 2),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", math.inf),
        ("repeat_last_n", -2),
        ("frequency_penalty", math.nan),
        ("presence_penalty", -math.inf),
        ("max_new_tokens", 0),
        ("max_new_tokens", -5),
        ("max_new_tokens", 10**30),
        ("max_new_tokens", MAX_NEW_TOKENS_LIMIT + 1),
        ("seed", -1),
        ("seed", 2**64),
        ("stop", [""]),
        ("stop", [3]),
        ("do_sample", "yes"),
    ],
)
def test_out_of_range_values_name_field_value_and_range(field, value):
    with pytest.raises(ConfigValidationError) as info:
        GenerationConfig.from_values({field: value})
    assert info.value.field == field
    assert repr(value) in str(info.value) or str(value) in str(info.value)
    assert "must be" in str(info.value)


def test_sampling_with_temperature_zero_is_an_error_but_greedy_is_fine():
    with pytest.raises(ConfigValidationError) as info:
        GenerationConfig.from_values({"do_sample": True, "temperature": 0})
    assert info.value.field == "temperature"
    assert GenerationConfig.from_values({"do_sample": False, "temperature": 0}).temperature == 0.0


def test_unknown_field_is_an_error():
    with pytest.raises(ConfigValidationError) as info:
        GenerationConfig.from_values({"temprature": 1.0})
    assert info.value.field == "temprature"


def test_integral_floats_from_json_are_accepted_as_ints():
    config = GenerationConfig.from_values({"top_k": 40.0, "max_new_tokens": 8.0, "stop": "END"})
    assert (config.top_k, config.max_new_tokens, config.stop) == (40, 8, ("END",))


# --- resolution ----------------------------------------------------------------------------------
def test_defaults_follow_transformers_greedy_and_top_k_50(tmp_path):
    preset = resolve_preset(lm_at(tmp_path))
    assert preset.values["do_sample"] is False and preset.values["top_k"] == 50
    assert set(preset.sources.values()) == {"default"}


def test_gguf_sampling_keys_map_to_fields_and_temp_decides_sampling(tmp_path):
    metadata = {
        "general.sampling.temp": 0.6,
        "general.sampling.top_k": 20,
        "general.sampling.top_p": 0.95,
        "general.sampling.min_p": 0.05,
        "general.sampling.penalty_repeat": 1.1,
        "general.sampling.penalty_last_n": 128,
        "general.sampling.sequence": "edskypmxt",
    }
    preset = resolve_preset(lm_at(tmp_path, metadata))
    expected = {
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "repeat_last_n": 128,
    }
    for field, value in expected.items():
        assert preset.values[field] == pytest.approx(value)
        assert preset.sources[field] == "gguf metadata"
    assert preset.sources["max_new_tokens"] == "default"
    assert any("general.sampling.sequence" in note for note in preset.notes)
    assert gguf_sampling_values({"general.sampling.temp": 0.0}) == {
        "do_sample": False,
        "temperature": 0.0,
    }


def test_priority_override_over_saved_over_generation_config_over_gguf_over_default(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "do_sample": True,
                "temperature": 0.7,
                "top_p": 0.8,
                "top_k": 30,
                "eos_token_id": [2, 7],
            }
        )
    )
    lm = lm_at(
        tmp_path,
        {
            "general.sampling.temp": 0.9,
            "general.sampling.top_k": 10,
            "general.sampling.min_p": 0.1,
            "general.sampling.top_p": 0.5,
        },
    )
    preset = resolve_preset(
        lm, saved={"top_p": 0.85, "temperature": 0.5}, overrides={"temperature": 0.3}
    )
    assert (preset.values["temperature"], preset.sources["temperature"]) == (0.3, "override")
    assert (preset.values["top_p"], preset.sources["top_p"]) == (0.85, "saved preset")
    assert (preset.values["top_k"], preset.sources["top_k"]) == (30, "generation_config.json")
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (
        True,
        "generation_config.json",
    )
    assert (preset.values["min_p"], preset.sources["min_p"]) == (0.1, "gguf metadata")
    assert (preset.values["seed"], preset.sources["seed"]) == (None, "default")
    assert preset.extra_eog_ids == {2, 7}
    json.dumps(preset.to_dict())  # serializable for the CLI and the app
    assert preset.records()["top_p"] == {"value": 0.85, "source": "saved preset"}


def test_absent_field_falls_through_to_the_next_source(tmp_path):
    # the generation config says nothing about do_sample: the GGUF's temp (sampling) decides it
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.9}))
    preset = resolve_preset(lm_at(tmp_path, {"general.sampling.temp": 0.8}))
    assert preset.values["do_sample"] is True and preset.sources["do_sample"] == "gguf metadata"
    assert preset.sources["top_k"] == "default" and preset.values["top_k"] == 50


def test_stem_json_beside_the_model_wins_over_generation_config_json(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    (tmp_path / "model.json").write_text(json.dumps({"temperature": 0.2, "do_sample": True}))
    preset = resolve_preset(lm_at(tmp_path))
    assert preset.values["temperature"] == 0.2


def test_stem_json_that_is_not_a_generation_config_is_skipped_and_noted(tmp_path):
    (tmp_path / "model.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 5})
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    preset = resolve_preset(lm_at(tmp_path))
    assert preset.values["temperature"] == 0.7
    assert any("model.json" in note for note in preset.notes)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", b"\xff\xfe\x00"])
def test_malformed_generation_config_is_reported(tmp_path, content):
    target = tmp_path / "generation_config.json"
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(PresetFileError) as info:
        resolve_preset(lm_at(tmp_path))
    assert "generation_config.json" in str(info.value)


def test_bad_value_in_a_source_names_the_source(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 3}))
    with pytest.raises(ConfigValidationError) as info:
        resolve_preset(lm_at(tmp_path))
    assert info.value.field == "top_p" and "generation_config.json" in str(info.value)


def test_unknown_override_field_is_an_error(tmp_path):
    with pytest.raises(ConfigValidationError) as info:
        resolve_preset(lm_at(tmp_path), overrides={"topk": 3})
    assert info.value.field == "topk"


def test_none_in_saved_preset_means_not_set(tmp_path):
    preset = resolve_preset(lm_at(tmp_path, {"general.sampling.top_k": 12}), saved={"top_k": None})
    assert (preset.values["top_k"], preset.sources["top_k"]) == (12, "gguf metadata")


def test_real_gguf_file_sampling_keys_and_generation_config_beside_it(tmp_path):
    from gguf import GGUFValueType

    from tests.tiny_models import write_tiny_model

    path = write_tiny_model(
        tmp_path / "tiny.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={
            "general.sampling.temp": (0.6, GGUFValueType.FLOAT32),
            "general.sampling.top_k": (20, GGUFValueType.INT32),
            "general.sampling.penalty_last_n": (-1, GGUFValueType.INT32),
        },
    )
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"top_p": 0.9, "transformers_version": "4.47"})
    )
    preset = resolve_preset(path)  # a bare path: the file is opened for its metadata
    assert preset.values["temperature"] == pytest.approx(0.6) and preset.values["do_sample"] is True
    assert (preset.values["top_k"], preset.sources["top_k"]) == (20, "gguf metadata")
    assert (preset.values["repeat_last_n"], preset.sources["repeat_last_n"]) == (
        -1,
        "gguf metadata",
    )
    assert (preset.values["top_p"], preset.sources["top_p"]) == (0.9, "generation_config.json")
    json.dumps(preset.to_dict())


# --- real-world files beside a model (issue 16) --------------------------------------------------
# What `transformers` writes with `GenerationConfig(...).save_pretrained()` for settings left
# unset: explicit nulls. A null states nothing, so lower sources still apply.
def test_null_values_in_generation_config_json_fall_through(tmp_path):
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "do_sample": True,
                "temperature": None,
                "top_k": None,
                "top_p": 0.9,
                "eos_token_id": None,
                "transformers_version": "4.47.1",
            }
        )
    )
    lm = lm_at(tmp_path, {"general.sampling.temp": 0.6})
    preset = resolve_preset(lm)
    assert (preset.values["temperature"], preset.sources["temperature"]) == (
        pytest.approx(0.6),
        "gguf metadata",
    )
    assert (preset.values["top_k"], preset.sources["top_k"]) == (50, "default")
    assert (preset.values["top_p"], preset.sources["top_p"]) == (0.9, "generation_config.json")
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (
        True,
        "generation_config.json",
    )
    assert preset.extra_eog_ids == frozenset()


# SmolLM2-135M-Instruct's config.json as published (abridged): it names generation keys too
# (bos/eos ids, transformers_version), but the model-config keys say what it really is.
SMOLLM2_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_hidden_layers": 30,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "vocab_size": 49152,
}


def test_a_model_config_json_named_like_the_gguf_is_not_a_preset(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps(SMOLLM2_CONFIG_JSON))
    preset = resolve_preset(lm_at(tmp_path))
    assert set(preset.sources.values()) == {"default"}
    assert preset.extra_eog_ids == frozenset()  # its eos_token_id is not taken either
    assert preset.notes == ("model.json beside the model is not a generation config; skipped",)


@pytest.mark.parametrize(
    "content,note",
    [
        ('{"license": "apache-2.0"}', "model.json beside the model is not a generation config"),
        ("[0.7]", "model.json beside the model is not a JSON object; skipped"),
        ("{oops", "model.json beside the model is not readable JSON; skipped"),
    ],
)
def test_an_unusable_stem_json_is_noted_and_generation_config_json_still_applies(
    tmp_path, content, note
):
    (tmp_path / "model.json").write_text(content)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    preset = resolve_preset(lm_at(tmp_path))
    assert (preset.values["temperature"], preset.sources["temperature"]) == (
        0.7,
        "generation_config.json",
    )
    assert len(preset.notes) == 1 and preset.notes[0].startswith(note)


def test_generation_config_that_is_not_an_object_names_what_it_found(tmp_path):
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(PresetFileError, match="must hold a JSON object, found list"):
        resolve_preset(lm_at(tmp_path))


@pytest.mark.parametrize("eos,ids", [(0, {0}), ([0, 7], {0, 7}), (5, {5}), ([], set())])
def test_eos_token_ids_in_generation_config_are_added(tmp_path, eos, ids):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert resolve_preset(lm_at(tmp_path)).extra_eog_ids == frozenset(ids)


@pytest.mark.parametrize("eos", [-1, True, [1, -2], [True], "2", [1.5], 2.0])
def test_bad_eos_token_id_is_refused_naming_the_file(tmp_path, eos):
    target = tmp_path / "generation_config.json"
    target.write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(PresetFileError) as info:
        resolve_preset(lm_at(tmp_path))
    assert str(info.value).startswith(f"{target}: eos_token_id=")
    assert "must be a token id or a list of token ids" in str(info.value)


def test_to_dict_is_values_sources_and_notes(tmp_path):
    (tmp_path / "model.json").write_text("{}")
    preset = resolve_preset(lm_at(tmp_path), overrides={"top_k": 3})
    assert preset.to_dict() == {
        "values": preset.values,
        "sources": preset.sources,
        "notes": list(preset.notes),
    }
    assert preset.to_dict()["sources"]["top_k"] == "override" and preset.to_dict()["notes"]


@pytest.mark.parametrize("layer", ["saved", "overrides"])
def test_bad_layers_name_the_layer_and_the_known_fields(tmp_path, layer):
    source = {"saved": "saved preset", "overrides": "override"}[layer]
    with pytest.raises(ConfigValidationError) as info:
        resolve_preset(lm_at(tmp_path), **{layer: [("top_k", 3)]})
    assert (info.value.field, info.value.value, info.value.allowed) == (
        source,
        [("top_k", 3)],
        "a mapping of field -> value",
    )
    with pytest.raises(ConfigValidationError) as info:
        resolve_preset(lm_at(tmp_path), **{layer: {"temprature": 0.5}})
    assert (info.value.field, info.value.value) == ("temprature", 0.5)
    assert info.value.allowed == (
        f"a known field ({', '.join(GenerationConfig.field_names())}) in the {source}"
    )


def test_an_invalid_merged_value_keeps_the_value_and_names_its_source(tmp_path):
    with pytest.raises(ConfigValidationError) as info:
        resolve_preset(lm_at(tmp_path), saved={"top_p": 3})
    assert (info.value.field, info.value.value) == ("top_p", 3)
    assert info.value.allowed.endswith("(value from saved preset)")


def test_a_model_object_without_path_or_gguf_gets_the_defaults():
    from types import SimpleNamespace

    for model in (SimpleNamespace(), SimpleNamespace(gguf=SimpleNamespace())):
        preset = resolve_preset(model)
        assert set(preset.sources.values()) == {"default"}


def test_numpy_scalars_from_the_gguf_reader_become_python_numbers():
    import numpy as np

    values = gguf_sampling_values(
        {
            "general.sampling.top_k": np.int32(20),
            "general.sampling.top_p": np.float32(0.5),
            "general.sampling.temp": np.float32(0.0),
        }
    )
    assert values == {"top_k": 20, "top_p": 0.5, "do_sample": False, "temperature": 0.0}
    assert type(values["top_k"]) is int and type(values["top_p"]) is float


def test_sampling_metadata_keeps_only_the_sampling_keys_as_plain_python_values():
    # What the app hands to its GUI thread (ModelInfo.sampling_metadata), then to resolve_preset.
    import numpy as np

    from engine.presets import sampling_metadata

    picked = sampling_metadata(
        {
            "general.sampling.temp": np.float32(0.5),
            "general.sampling.top_k": np.int32(40),
            "general.name": "tiny",
            "tokenizer.chat_template": "{{ messages }}",
            "llama.context_length": np.uint32(2048),
        }
    )
    assert picked == {"general.sampling.temp": 0.5, "general.sampling.top_k": 40}
    assert type(picked["general.sampling.temp"]) is float
    assert type(picked["general.sampling.top_k"]) is int
