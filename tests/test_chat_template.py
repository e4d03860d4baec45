"""Chat templates: the model's own template in a sandbox, named fallbacks, readable errors.

Expected strings are written by hand from the template text / Gemma's documented turn format,
not produced by our code.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError, ChatTemplateLimitError
from engine.gguf import open_gguf
from engine.tokenizer import Tokenizer

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def smollm2_chat(smollm2_path):
    gguf = open_gguf(smollm2_path)
    tokenizer = Tokenizer.from_gguf(gguf)
    return gguf, tokenizer, ChatTemplate.from_gguf(gguf, tokenizer)


class FakeTokenizer:
    """Just what ChatTemplate reads from a tokenizer."""

    def __init__(self, tokens, bos_id=None, eos_id=None, add_bos=False):
        self.tokens, self.bos_id, self.eos_id, self.add_bos = tokens, bos_id, eos_id, add_bos

    def token_id(self, text):
        return self.tokens.index(text) if text in self.tokens else None


GEMMA_LIKE = FakeTokenizer(
    ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
    bos_id=2,
    eos_id=1,
    add_bos=True,
)


# --- the model's own template -------------------------------------------------------------------
def test_smollm2_template_renders_known_chatml(smollm2_chat):
    _, _, template = smollm2_chat
    assert not template.is_fallback
    assert "chatml" in template.name
    text = template.render([{"role": "user", "content": "What is 2+2?"}])
    assert text == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_template_uses_given_system_prompt_and_history(smollm2_chat):
    _, _, template = smollm2_chat
    messages = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "Thanks"},
    ]
    assert template.render(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nAnswer in French.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nBonjour !<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
    )


def test_rendered_chat_tokenizes_with_single_special_ids(smollm2_chat):
    _, tokenizer, template = smollm2_chat
    ids = tokenizer.encode(template.render([{"role": "user", "content": "Hi"}]), add_special=True)
    im_start, im_end = tokenizer.token_id("<|im_start|>"), tokenizer.token_id("<|im_end|>")
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert ids[0] == im_start  # SmolLM2 adds no BOS


# --- fallbacks ----------------------------------------------------------------------------------
def test_gemma_fallback_turn_format_folds_system_into_first_user_turn():
    template = ChatTemplate.from_metadata({"general.architecture": "gemma3"}, GEMMA_LIKE)
    assert template.is_fallback and template.name == "gemma (fallback)"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    # The tokenizer adds BOS itself, so the rendered text must not start with "<bos>".
    assert template.render(messages) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_fallback_keeps_bos_text_when_tokenizer_does_not_add_it():
    tok = FakeTokenizer(GEMMA_LIKE.tokens, bos_id=2, eos_id=1, add_bos=False)
    template = ChatTemplate.from_metadata({"general.architecture": "gemma3"}, tok)
    assert template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    )


def test_gemma_fallback_refuses_non_alternating_roles():
    template = ChatTemplate.from_metadata({"general.architecture": "gemma3"}, GEMMA_LIKE)
    with pytest.raises(ChatTemplateError, match="alternate"):
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_real_gemma3_file_gets_gemma_fallback(gemma3_path):
    gguf = open_gguf(gemma3_path)
    assert "tokenizer.chat_template" not in gguf.metadata  # the base model ships no template
    tok = FakeTokenizer(["<pad>", "<eos>", "<bos>"], bos_id=2, eos_id=1, add_bos=True)
    template = ChatTemplate.from_gguf(gguf, tok)
    assert template.is_fallback and template.name == "gemma (fallback)"


def test_chatml_fallback_for_other_models_without_template():
    tok = FakeTokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos_id=None, eos_id=2)
    template = ChatTemplate.from_metadata({"general.architecture": "llama"}, tok)
    assert template.is_fallback and template.name == "chatml (fallback)"
    assert template.render(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    ) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")


# --- environment features templates rely on -------------------------------------------------------
def render(source, messages=({"role": "user", "content": "hi"},), **kwargs):
    return ChatTemplate(source, name="test", bos_token="<s>", eos_token="</s>").render(
        list(messages), **kwargs
    )


def test_trim_and_lstrip_blocks_like_hf():
    source = "{% for m in messages %}\n    {{ m['content'] }}\n{% endfor %}"
    # trim_blocks eats the newline after a tag, lstrip_blocks the indentation before one.
    assert render(source) == "    hi\n"


def test_bos_eos_variables_and_generation_prompt_flag():
    source = "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}{% if add_generation_prompt %}GEN{% endif %}"
    assert render(source) == "<s>hi</s>GEN"
    assert render(source, add_generation_prompt=False) == "<s>hi</s>"


def test_tojson_does_not_html_escape_and_keeps_unicode():
    assert render("{{ messages | tojson }}", [{"role": "user", "content": "<b>é</b>"}]) == (
        '[{"role": "user", "content": "<b>é</b>"}]'
    )
    assert (
        render("{{ {'b': 1, 'a': [2]} | tojson(indent=1, sort_keys=true) }}")
        == '{\n "a": [\n  2\n ],\n "b": 1\n}'
    )


def test_strftime_now_and_extra_variables():
    import datetime

    assert render("{{ strftime_now('%Y') }}") == str(datetime.datetime.now().year)
    assert (
        render("{% if tools %}T{% else %}none{% endif %}") == "none"
    )  # undefined is falsy, as in HF
    assert render("{{ tools | length }}", tools=[1, 2]) == "2"


def test_loopcontrols_and_generation_block():
    source = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}"
    assert (
        render(source, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        == "[a]"
    )


# --- errors and the sandbox ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ messages.__class__ }}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_blocks_attribute_escapes(source):
    with pytest.raises(ChatTemplateError, match="unsafe operation"):
        render(source)


def test_cve_2024_34359_payload_is_refused():
    payload = (
        '{% for x in ().__class__.__base__.__subclasses__() %}{% if "warning" in x.__name__ %}'
        "{{ x()._module.__builtins__['__import__']('os').popen('touch /tmp/pwned').read() }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ChatTemplateError, match="unsafe operation"):
        render(payload)


def test_immutable_sandbox_refuses_mutating_inputs():
    with pytest.raises(ChatTemplateError, match="unsafe operation"):
        render("{% set _ = messages.append({'role': 'x'}) %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'a' * 100000000 }}",  # memory
        "{{ [1] * 100000000 }}",
        "{{ 10 ** 100000000 }}",  # CPU in big-integer arithmetic
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",  # time
        "{% for i in range(100000) %}{{ 'x' * 99 }}{% endfor %}",  # output size
    ],
)
def test_hostile_templates_hit_resource_limits_quickly(source):
    import time

    start = time.perf_counter()
    with pytest.raises(ChatTemplateLimitError, match="limit"):
        render(source)
    assert time.perf_counter() - start < 10  # refused, not run to completion (minutes / GBs)


def test_ordinary_ranges_and_repetition_still_work():
    assert (
        render("{% for i in range(3) %}{{ i }}{% endfor %}{{ '-' * 3 }}{{ 2 ** 10 }}")
        == "012---1024"
    )


def test_raise_exception_surfaces_template_message():
    with pytest.raises(ChatTemplateError, match="Only user and assistant roles are supported!"):
        render(
            "{% if messages[0]['role'] != 'assistant' %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
        )


def test_syntax_error_names_the_line_and_is_raised_on_render():
    template = ChatTemplate(
        "ok\n{% for m in messages %}\n{{ m['content'] }\n{% endfor %}", name="broken"
    )
    assert template.error is not None and "line 3" in str(template.error)
    with pytest.raises(ChatTemplateError, match=r"'broken' has a syntax error on line 3"):
        template.render([{"role": "user", "content": "x"}])


def test_render_error_names_the_line():
    with pytest.raises(ChatTemplateError, match=r"failed on line 2: UndefinedError"):
        render("fine\n{{ messages[3]['content'] }}")


def test_messages_are_validated():
    with pytest.raises(ChatTemplateError, match="list of"):
        ChatTemplate("x", name="t").render("hello")
    with pytest.raises(ChatTemplateError, match=r"messages\[1\] needs a non-empty string 'role'"):
        render("x", messages=[{"role": "user", "content": "a"}, {"content": "b"}])


def test_guessed_names_for_embedded_templates():
    tok = SimpleNamespace(
        tokens=["a"], bos_id=None, eos_id=None, add_bos=False, token_id=lambda t: None
    )
    llama3 = "{{ '<|start_header_id|>' + messages[0]['role'] + '<|end_header_id|>' }}"
    assert (
        ChatTemplate.from_metadata({"tokenizer.chat_template": llama3}, tok).name
        == "llama3 (from the model file)"
    )
    assert (
        ChatTemplate.from_metadata({"tokenizer.chat_template": "{{ 1 }}"}, tok).name
        == "custom (from the model file)"
    )
