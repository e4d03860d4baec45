"""The "LocalChat chat defaults" layer and the do_sample implication, with the real
resolve_preset (engine/presets.py) and, at the end, as the preset panel shows them."""

import json

import pytest

from app.engine_bridge import RealEngine
from engine.presets import (
    CHAT_DEFAULTS,
    SOURCE_CHAT_DEFAULTS,
    SOURCE_IMPLIED,
    resolve_preset,
)
from engine.types import ModelInfo
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window

CHAT = "LocalChat chat defaults"


def model(tmp_path, template="chatml", sampling=None, generation_config=None):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"")  # only its folder matters to preset resolution
    if generation_config is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation_config))
    return ModelInfo(
        path=str(path),
        name="model.gguf",
        architecture="llama",
        n_ctx=2048,
        template=template,
        sampling_metadata=sampling or {},
    )


def test_a_chat_model_that_states_nothing_gets_the_chat_defaults_labelled(tmp_path):
    preset = resolve_preset(model(tmp_path), chat=True)
    assert SOURCE_CHAT_DEFAULTS == CHAT
    expected = {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.0,
    }
    assert expected == CHAT_DEFAULTS
    assert {k: preset.values[k] for k in expected} == expected
    assert {k: preset.sources[k] for k in expected} == dict.fromkeys(expected, CHAT)
    assert preset.sources["top_k"] == "default" and preset.values["top_k"] == 50


@pytest.mark.parametrize(
    "kwargs",
    [
        {"generation_config": {"temperature": 0.6}},  # the checkpoint has an opinion
        {"generation_config": {"do_sample": False}},
        {"sampling": {"general.sampling.top_p": 0.8}},
        {"template": "chatml (fallback)"},  # a base model: no chat template of its own
    ],
)
def test_the_chat_defaults_stay_out_when_the_checkpoint_states_sampling_or_has_no_template(
    tmp_path, kwargs
):
    preset = resolve_preset(model(tmp_path, **kwargs), chat=True)
    assert CHAT not in preset.sources.values()


def test_a_raw_prompt_is_not_chat_and_a_checkpoints_penalty_still_wins(tmp_path):
    assert CHAT not in resolve_preset(model(tmp_path)).sources.values()
    preset = resolve_preset(
        model(tmp_path, generation_config={"repetition_penalty": 1.3}), chat=True
    )
    assert preset.sources["temperature"] == CHAT
    assert (preset.values["repetition_penalty"], preset.sources["repetition_penalty"]) == (
        1.3,
        "generation_config.json",
    )


def test_a_sampling_override_implies_do_sample_true_over_a_lower_greedy_source(tmp_path):
    info = model(tmp_path, template="chatml (fallback)")  # greedy by transformers' default
    preset = resolve_preset(info, overrides={"temperature": 0.8}, chat=True)
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (True, SOURCE_IMPLIED)
    assert "temperature=0.8 (override)" in preset.reasons["do_sample"]
    assert "False from default" in preset.reasons["do_sample"]
    assert preset.reasons["do_sample"] in preset.notes
    for field, value in (("top_k", 20), ("top_p", 0.5), ("min_p", 0.1)):
        implied = resolve_preset(info, saved={field: value})
        assert (implied.values["do_sample"], implied.sources["do_sample"]) == (True, SOURCE_IMPLIED)
        assert f"{field}={value!r} (saved preset)" in implied.reasons["do_sample"]


def test_a_greedy_generation_config_is_overridden_only_by_your_sampling_value(tmp_path):
    info = model(tmp_path, generation_config={"do_sample": False, "temperature": 0.6})
    assert resolve_preset(info).values["do_sample"] is False
    preset = resolve_preset(info, overrides={"top_p": 0.8})
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (True, SOURCE_IMPLIED)
    assert "False from generation_config.json" in preset.reasons["do_sample"]


def test_do_sample_set_yourself_is_never_implied_away(tmp_path):
    info = model(tmp_path, template="chatml (fallback)")
    preset = resolve_preset(info, overrides={"temperature": 0.8, "do_sample": False})
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (False, "override")
    assert preset.reasons == {}
    # A saved do_sample outranks an override of temperature too: it is your own choice.
    preset = resolve_preset(info, saved={"do_sample": False}, overrides={"temperature": 0.8})
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (False, "saved preset")


def test_temperature_zero_means_greedy_like_the_cli(tmp_path):
    # Chat defaults sample; a temperature 0 override would otherwise be refused as invalid.
    preset = resolve_preset(model(tmp_path), overrides={"temperature": 0}, chat=True)
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (False, SOURCE_IMPLIED)
    assert "temperature 0 (greedy)" in preset.reasons["do_sample"]


def test_no_reason_when_the_lower_source_already_agrees(tmp_path):
    preset = resolve_preset(model(tmp_path), overrides={"temperature": 1.1}, chat=True)
    assert (preset.values["do_sample"], preset.sources["do_sample"]) == (True, CHAT)
    assert preset.reasons == {}


class RealPresets(FakeEngine):
    """The fake engine's streaming with the real preset resolution (ModelInfo -> presets)."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def describe(self, lm):
        return model(self.folder)

    def resolve_preset(self, model_info, saved, overrides):
        return RealEngine().resolve_preset(model_info, saved, overrides)


def test_the_panel_shows_chat_defaults_and_the_implied_value_with_its_reason(qtbot, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    window = make_window(qtbot, tmp_path, RealPresets(folder))
    panel = window.preset_panel
    qtbot.waitUntil(lambda: panel.view is not None, timeout=WAIT_MS)
    assert panel.source_text("temperature") == CHAT
    assert panel.source_label("temperature") == "chat defaults"
    assert panel.reasons_label.isHidden()
    window._on_preset_edit("temperature", "0")
    assert (panel.value_text("do_sample"), panel.source_label("do_sample")) == ("False", "implied")
    assert not panel.reasons_label.isHidden()
    assert "temperature 0 (greedy)" in panel.reasons_label.text()
    window._on_preset_edit("do_sample", "false")
    window._on_preset_edit("temperature", "0.9")
    assert (panel.value_text("do_sample"), panel.source_label("do_sample")) == (
        "False",
        "you (unsaved)",
    )
    assert panel.reasons_label.isHidden()
    close_window(window)


def test_smollm2_states_nothing_so_its_chat_samples_with_the_chat_defaults(smollm2_path):
    """The motivating case: the embedded SmolLM2's GGUF has no general.sampling.* keys and no
    generation_config.json beside it; `info` shows both presets."""
    from engine.__main__ import model_info

    info = model_info(smollm2_path)
    assert info["preset"]["sources"]["temperature"] == "default"
    assert info["preset"]["values"]["do_sample"] is False
    assert info["chat_preset"]["sources"]["temperature"] == CHAT
    assert info["chat_preset"]["values"]["do_sample"] is True


# --- which models count as chat models (has_own_chat_template), from each kind of handle --------
def loaded(tmp_path, chat_template):
    from fake_model import FakeGGUF, fake_lm, script_tokens

    path = tmp_path / "model.gguf"
    path.write_bytes(b"")
    return fake_lm(script_tokens(0, []), path=path, gguf=FakeGGUF({}), chat_template=chat_template)


def test_a_loaded_model_is_a_chat_model_unless_its_template_is_the_fallback(tmp_path):
    from engine.chat_template import CHATML_TEMPLATE, ChatTemplate
    from engine.presets import has_own_chat_template

    own = loaded(tmp_path, ChatTemplate(CHATML_TEMPLATE, name="chatml"))
    fallback = loaded(
        tmp_path, ChatTemplate(CHATML_TEMPLATE, name="chatml (fallback)", is_fallback=True)
    )
    assert has_own_chat_template(own) is True
    assert has_own_chat_template(fallback) is False
    assert resolve_preset(own, chat=True).sources["temperature"] == CHAT
    assert CHAT not in resolve_preset(fallback, chat=True).sources.values()


def test_a_template_object_that_does_not_say_fallback_is_the_models_own(tmp_path):
    # Anything with .chat_template counts (a test double, a template from another loader): only
    # an explicit is_fallback marks a base model.
    from types import SimpleNamespace

    from engine.presets import has_own_chat_template

    model_with_plain_template = loaded(tmp_path, SimpleNamespace(name="custom"))
    assert has_own_chat_template(model_with_plain_template) is True
    assert resolve_preset(model_with_plain_template, chat=True).sources["top_p"] == CHAT


def test_a_model_object_that_names_no_template_is_not_a_chat_model():
    from types import SimpleNamespace

    from engine.presets import has_own_chat_template

    assert has_own_chat_template(SimpleNamespace()) is False
    preset = resolve_preset(SimpleNamespace(), chat=True)
    assert set(preset.sources.values()) == {"default"}


@pytest.mark.parametrize("as_str", [False, True])
def test_a_gguf_path_is_a_chat_model_exactly_when_its_file_has_a_chat_template(tmp_path, as_str):
    from gguf import GGUFValueType

    from engine.presets import has_own_chat_template
    from tests.tiny_models import write_tiny_model

    chat_dir, base_dir = tmp_path / "chat", tmp_path / "base"
    chat_dir.mkdir()
    base_dir.mkdir()
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = write_tiny_model(
        chat_dir / "chat.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={"tokenizer.chat_template": (template, GGUFValueType.STRING)},
    )
    base = write_tiny_model(base_dir / "base.gguf", "llama", tokenizer=None)
    chat_arg, base_arg = (str(chat), str(base)) if as_str else (chat, base)
    assert has_own_chat_template(chat_arg) is True
    assert has_own_chat_template(base_arg) is False
    assert resolve_preset(chat_arg, chat=True).sources["min_p"] == CHAT
    assert CHAT not in resolve_preset(base_arg, chat=True).sources.values()


def test_the_implied_reason_names_every_value_you_set_and_how_to_choose(tmp_path):
    info = model(tmp_path, template="chatml (fallback)")  # greedy by transformers' default
    preset = resolve_preset(info, overrides={"temperature": 0.8, "top_p": 0.5})
    assert preset.reasons["do_sample"] == (
        "do_sample is True because you set temperature=0.8 (override), top_p=0.5 (override)"
        " while it was False from default; set do_sample yourself to choose"
    )
    greedy = resolve_preset(model(tmp_path), overrides={"temperature": 0}, chat=True)
    assert greedy.reasons["do_sample"] == (
        "do_sample is False because you set temperature 0 (greedy) while it was True from"
        " LocalChat chat defaults; set do_sample yourself to choose"
    )
