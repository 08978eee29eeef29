"""Tool calls parsed from generated text (Hermes/Qwen convention)."""

import json

import pytest

from smgrl.tito.toolcalls import parser_for, strip_eos

H = parser_for("hermes")


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("plain answer", "plain answer", []),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', None, [("f", {"a": 1})]),
        (
            'Let me look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
            "Let me look.",
            [("f", {})],
        ),
        (
            '<tool_call>\n{"name": "f", "arguments": {"x": "é"}}\n</tool_call>\n<tool_call>\n{"name": "g"}\n</tool_call>',
            None,
            [("f", {"x": "é"}), ("g", {})],
        ),
        ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>', []),
        ("<tool_call> unterminated", "<tool_call> unterminated", []),
    ],
)
def test_hermes(text, content, calls):
    p = H.parse(text)
    assert p.content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in p.tool_calls] == calls
    for c in p.tool_calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
    assert len({c["id"] for c in p.tool_calls}) == len(calls)


def test_arguments_keep_the_template_json_conventions():
    (c,) = H.parse('<tool_call>{"name": "f", "arguments": {"b": "ü", "a": [1, 2]}}</tool_call>').tool_calls
    assert c["function"]["arguments"] == '{"b": "ü", "a": [1, 2]}'


def test_unknown_parser_and_none():
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        parser_for("nope")
    assert parser_for("none").parse("<tool_call>{}</tool_call>").tool_calls == ()


def test_strip_eos():
    assert strip_eos("hi<|im_end|>", "<|im_end|>") == "hi"
    assert strip_eos("hi", "<|im_end|>") == "hi"
    assert strip_eos("hi", None) == "hi"
