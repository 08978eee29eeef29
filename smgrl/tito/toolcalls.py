"""Tool calls parsed from generated text, behind a small parser interface chosen per model family.

``parse(text) -> Parsed(content, tool_calls)``. Tool calls are OpenAI-shaped
(``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``); arguments are
re-serialised with the same JSON conventions the chat template's ``tojson`` uses, so the assistant
message the agent echoes back renders to the text the model produced.

Hermes/Qwen (``<tool_call>{json}</tool_call>``) is the first parser; ``none`` leaves text alone.
A block that is not valid JSON stays in the content (the model's words are never dropped).
"""

from __future__ import annotations

import json
import re
from typing import Protocol

import attrs

from smgrl.core.ids import new_hex_id


@attrs.frozen
class Parsed:
    content: str | None
    tool_calls: tuple[dict, ...]


class ToolCallParser(Protocol):
    name: str

    def parse(self, text: str) -> Parsed: ...


def _call_id() -> str:
    return "call_" + new_hex_id()[8:]  # 24 hex digits, as OpenAI's call ids


@attrs.frozen
class NoParser:
    name: str = "none"

    def parse(self, text: str) -> Parsed:
        return Parsed(text, ())


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@attrs.frozen
class HermesParser:
    name: str = "hermes"

    def parse(self, text: str) -> Parsed:
        start = text.find("<tool_call>")
        if start < 0:
            return Parsed(text, ())
        calls = []
        for m in _HERMES.finditer(text, start):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                return Parsed(text, ())
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return Parsed(text, ())
            args = obj.get("arguments", {})
            calls.append(
                {
                    "id": _call_id(),
                    "type": "function",
                    "function": {
                        "name": obj["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                    },
                }
            )
        if not calls:
            return Parsed(text, ())
        # The template writes "\n" between the content and the first call: give the content back
        # without it, so the echoed message renders to the same text.
        content = text[:start].rstrip("\n")
        return Parsed(content or None, tuple(calls))


PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser(), "qwen": HermesParser(), "none": NoParser()}


def parser_for(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(sorted(PARSERS))})") from None


def strip_eos(text: str, eos_token: str | None) -> str:
    """Generated text without its trailing end-of-turn token (the content the client sees)."""
    if eos_token and text.endswith(eos_token):
        return text[: -len(eos_token)]
    return text
