"""Loading a model directory and rendering its chat template with the HF conventions."""

import json

import attrs
import pytest

from smgrl.tito.chat import ChatTokenizer, TemplateError, TitoError
from smgrl.tito.testkit import make_model_dir


def test_load_renders_chatml_and_round_trips(chat):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "héllo wörld"}]
    text = chat.render(msgs, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhéllo wörld<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = chat.encode(text)
    assert chat.decode(ids) == text
    assert chat.eos_token == "<|im_end|>"
    assert chat.eos_id == chat.tokenizer.token_to_id("<|im_end|>")
    # special tokens are recognised in rendered text, never split into bytes
    assert ids.count(chat.eos_id) == 2
    assert chat.eos_id in chat.special_ids


def test_tool_call_arguments_reach_the_template_as_objects(chat):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"ä": 1}'}}
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = chat.render(msgs)
    assert '{"name": "f", "arguments": {"ä": 1}}' in text  # tojson keeps non-ASCII, no double encoding
    assert call["function"]["arguments"] == '{"ä": 1}'  # the caller's message is untouched


def test_tools_render_into_the_system_block(chat):
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    text = chat.render([{"role": "user", "content": "u"}], tools=tools)
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>\n" + json.dumps(tools[0]))


def test_raise_exception_is_a_template_error(chat):
    with pytest.raises(TemplateError) as e:
        chat.render([{"role": "wizard", "content": "x"}])
    assert e.value.code == "chat_template_error"
    assert "unknown role" in e.value.message


def test_chat_template_kwargs_are_template_variables(tmp_path, chat):
    d = make_model_dir(tmp_path / "m")
    (d / "chat_template.jinja").write_text("{{ greeting }}|{{ messages | length }}|{{ eos_token }}")
    c = ChatTokenizer.load(d)  # the .jinja file wins over the config's template
    assert c.render([{"role": "user", "content": "x"}], kwargs={"greeting": "hi"}) == "hi|1|<|im_end|>"


def test_named_template_list_uses_default(tmp_path):
    d = make_model_dir(tmp_path / "m")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ChatTokenizer.load(d).render([]) == "D"


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer_not_found"),
        (lambda d: (d / "tokenizer.json").write_text("{not json"), "tokenizer_invalid"),
        (lambda d: _set_template(d, None), "chat_template_missing"),
        (lambda d: _set_template(d, "{% for %}"), "chat_template_invalid"),
    ],
)
def test_bad_model_directories_fail_with_a_stable_code(tmp_path, mutate, code):
    d = make_model_dir(tmp_path / "m")
    mutate(d)
    with pytest.raises(TitoError) as e:
        ChatTokenizer.load(d)
    assert e.value.code == code


def _bundle(d) -> bytes:
    """The zip an engine's GetTokenizer streams for model directory ``d``."""
    from smgrl.fake.grpc_front import tokenizer_bundle

    return tokenizer_bundle(str(d))[0]


def test_an_engine_s_tokenizer_bundle_loads_as_its_directory_does(tmp_path):
    d = make_model_dir(tmp_path / "m")
    msgs = [{"role": "user", "content": "héllo"}]
    want = ChatTokenizer.load(d)
    got = ChatTokenizer.from_bundle(_bundle(d), name="m")
    assert got.render(msgs, add_generation_prompt=True) == want.render(msgs, add_generation_prompt=True)
    assert got.tokenize_messages(msgs) == want.tokenize_messages(msgs)
    assert (got.eos_id, got.special_ids, got.name) == (want.eos_id, want.special_ids, "m")
    # HF's chat_template.json (what the servicers zip beside the config) wins over the config's.
    (d / "chat_template.json").write_text(json.dumps({"chat_template": "J{{ messages | length }}"}))
    assert ChatTokenizer.from_bundle(_bundle(d)).render(msgs) == "J1"
    (d / "chat_template.jinja").write_text("K{{ messages | length }}")  # and the .jinja file over both
    assert ChatTokenizer.from_bundle(_bundle(d)).render(msgs) == "K1"


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer_not_found"),
        (lambda d: (d / "tokenizer.json").write_text("{not json"), "tokenizer_invalid"),
        (lambda d: _set_template(d, None), "chat_template_missing"),
    ],
)
def test_a_bad_tokenizer_bundle_fails_with_a_stable_code(tmp_path, mutate, code):
    d = make_model_dir(tmp_path / "m")
    mutate(d)
    with pytest.raises(TitoError) as e:
        ChatTokenizer.from_bundle(_bundle(d))
    assert e.value.code == code
    with pytest.raises(TitoError) as e:
        ChatTokenizer.from_bundle(b"not a zip")
    assert e.value.code == "tokenizer_invalid"


def test_sandbox_refuses_unsafe_attribute_access(tmp_path):
    d = make_model_dir(tmp_path / "m")
    _set_template(d, "{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError):
        ChatTokenizer.load(d).render([])


def _set_template(d, source):
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = source
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))


class _Spy:
    """The real tokenizer, recording which of its encode methods is called."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls: list[str] = []

    def __getattr__(self, name):
        if name.startswith("encode"):
            self.calls.append(name)
        return getattr(self.tokenizer, name)


def test_a_long_text_is_encoded_with_the_gil_released(chat):
    # tokenizers' Tokenizer.encode keeps the GIL for its whole Rust call: a multi-MB prompt
    # encoded in a worker thread still stalled the gateway's event loop for seconds; encode_batch
    # releases the GIL. The ids must be the same either way.
    from smgrl.tito.chat import GIL_FREE_CHARS

    text = chat.render([{"role": "user", "content": "read the file and run the test " * 1000}])
    assert len(text) > GIL_FREE_CHARS
    expected = chat.tokenizer.encode(text, add_special_tokens=False).ids
    spy = _Spy(chat.tokenizer)
    twin = attrs.evolve(chat, tokenizer=spy)
    assert twin.encode(text) == expected
    assert spy.calls == ["encode_batch"]
    assert twin.encode("short") == chat.tokenizer.encode("short", add_special_tokens=False).ids
    assert spy.calls == ["encode_batch", "encode"]
