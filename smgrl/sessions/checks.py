"""What a session turn's body must look like before the template sees it, and how big it is (pure).

A chat template and a tokenizer fail in their own ways on shapes they do not expect (a tool call
that is a string, a ``function`` that is not an object, a number as ``reasoning_content``, a lone
surrogate the tokenizer cannot encode): each such body is refused here with ``invalid_turn``
naming the field, never left to raise a TypeError inside the render.

``input_size`` says whether a turn is long enough to be prepared off the event loop. It counts
the text of everything the template renders (every message field, the tools, the template
kwargs), not one field: 8 MB in a tool's description stalls the loop as surely as 8 MB of
content. The walk stops as soon as the count passes the limit, so on the loop it costs at most
about ``limit`` characters' worth of nodes, whatever the body holds. ``check_messages`` walks the
whole conversation, so it runs where the render runs (in the thread for a long turn).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from smgrl.sessions.errors import InvalidTurn

__all__ = ["check_messages", "check_tools", "input_size"]

_TEXT_FIELDS = ("content", "reasoning_content", "name", "tool_call_id")
_ROLES = ("system", "user", "assistant", "tool", "developer", "function")


def input_size(*parts: Any, limit: int) -> int:
    """Characters of text (strings, and a few per other value) in ``parts``, counted until the
    count exceeds ``limit`` (then some number above it is returned)."""
    n = 0
    stack: list[Any] = list(parts)
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is str:
            n += len(value)
        elif kind is dict:
            n += 8
            for k, v in value.items():
                n += len(k) if type(k) is str else 8
                stack.append(v)
        elif kind in (list, tuple):
            n += 8
            stack.extend(value)
        else:
            n += 8
        if n > limit:
            return n
    return n


def _text_ok(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON): no tokenizer takes it
        return False
    return True


def _check_text(value: Any, where: str, *, parts: bool = False) -> None:
    if value is None:
        return
    if type(value) is str:
        if not _text_ok(value):
            raise InvalidTurn(f"{where} holds a lone surrogate (not valid Unicode text)")
        return
    if parts and type(value) is list:
        for i, part in enumerate(value):
            if type(part) is not dict:
                raise InvalidTurn(f"{where}[{i}] must be a content part object")
            _check_text(part.get("text"), f"{where}[{i}].text")
        return
    raise InvalidTurn(f"{where} must be a string" + (" or a list of content parts" if parts else ""))


def _check_tool_call(call: Any, where: str) -> None:
    if type(call) is not dict:
        raise InvalidTurn(f"{where} must be a tool call object")
    function = call.get("function")
    if type(function) is not dict:
        raise InvalidTurn(f"{where}.function must be an object with a name and arguments")
    name = function.get("name")
    if type(name) is not str:
        raise InvalidTurn(f"{where}.function.name must be a string")
    _check_text(name, f"{where}.function.name")
    arguments = function.get("arguments")
    if arguments is not None and type(arguments) not in (str, dict):
        raise InvalidTurn(f"{where}.function.arguments must be a JSON string or an object")
    if type(arguments) is str:
        _check_text(arguments, f"{where}.function.arguments")
    elif type(arguments) is dict and not _strings_ok(arguments):
        raise InvalidTurn(f"{where}.function.arguments holds a lone surrogate")
    for key in ("id", "type"):
        if call.get(key) is not None and type(call.get(key)) is not str:
            raise InvalidTurn(f"{where}.{key} must be a string")


def _strings_ok(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is str:
            if not _text_ok(v):
                return False
        elif type(v) is dict:
            for k, x in v.items():
                if type(k) is str and not _text_ok(k):
                    return False
                stack.append(x)
        elif type(v) is list:
            stack.extend(v)
    return True


def check_messages(messages: Sequence[Any]) -> None:
    """InvalidTurn naming the first field the template could not take."""
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if type(m) is not dict:
            raise InvalidTurn(f"{where} must be a message object")
        role = m.get("role")
        if role not in _ROLES:
            raise InvalidTurn(f"{where}.role must be one of {', '.join(_ROLES)}")
        for field in _TEXT_FIELDS:
            _check_text(m.get(field), f"{where}.{field}", parts=field == "content")
        calls = m.get("tool_calls")
        if calls is not None:
            if type(calls) is not list:
                raise InvalidTurn(f"{where}.tool_calls must be a list of tool call objects")
            for j, call in enumerate(calls):
                _check_tool_call(call, f"{where}.tool_calls[{j}]")


def check_tools(tools: Any) -> None:
    """``tools``: absent, or a list of tool objects whose text is valid Unicode."""
    if tools is None:
        return
    if type(tools) is not list:
        raise InvalidTurn("tools must be a list of tool objects")
    for i, tool in enumerate(tools):
        if type(tool) is not dict:
            raise InvalidTurn(f"tools[{i}] must be a tool object")
        function = tool.get("function")
        if function is not None and type(function) is not dict:
            raise InvalidTurn(f"tools[{i}].function must be an object")
        if not _strings_ok(tool):
            raise InvalidTurn(f"tools[{i}] holds a lone surrogate")
