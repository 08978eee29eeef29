"""Identity of a conversation prefix: render context + message hashes (docs/sessions.md, "How a turn is built").

The running hash folds a context preamble (tools canonicalised with sorted keys, template kwargs
sorted by key, or the marker ``none``), then each message: its role and text content (multi-part:
text parts as text, other parts as canonical JSON); for assistant messages also the reasoning text
and each tool call's id, type, name and arguments re-serialised with sorted keys (unparseable
arguments verbatim, missing ``{}``); for tool messages the ``tool_call_id``. ``name`` is not hashed;
assistant content ``None`` and ``""`` hash the same. Every field is length-prefixed so that no two
different messages fold to the same bytes.

BLAKE2b (stdlib) stands in for SMG's BLAKE3: hashes never leave the gateway, so only the
properties matter (deterministic, collision resistant).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _field(h, tag: bytes, text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    h.update(tag + len(data).to_bytes(8, "little") + data)


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append("t" + p["text"])
            else:
                parts.append("j" + _canon(p))
        return "\x00".join(parts)
    return _canon(content)


def _arguments(args) -> str:
    if args is None:
        return "{}"
    if isinstance(args, str):
        try:
            return _canon(json.loads(args))
        except ValueError:
            return args
    return _canon(args)


def render_context(tools: Sequence[dict] | None, kwargs: dict | None) -> str:
    """Canonical text of what besides the messages shapes a render."""
    if not tools and not kwargs:
        return "none"
    return _canon({"tools": list(tools or []), "kwargs": dict(sorted((kwargs or {}).items()))})


def start(context: str):
    h = hashlib.blake2b(digest_size=32)
    _field(h, b"C", context)
    return h


def fold(h, message: dict) -> None:
    """Fold one message into the running hash ``h`` (in place)."""
    role = message.get("role")
    _field(h, b"R", str(role))
    _field(h, b"T", _content_text(message.get("content")))
    if role == "assistant":
        _field(h, b"r", message.get("reasoning_content") or "")
        for tc in message.get("tool_calls") or []:
            f = tc.get("function") or {}
            _field(h, b"i", str(tc.get("id", "")))
            _field(h, b"y", str(tc.get("type", "")))
            _field(h, b"n", str(f.get("name", "")))
            _field(h, b"a", _arguments(f.get("arguments")))
        _field(h, b"E", "")  # end of the tool-call list
    elif role == "tool":
        _field(h, b"c", str(message.get("tool_call_id", "")))


def prefix_hashes(context: str, messages: Sequence[dict]) -> Iterator[tuple[int, bytes]]:
    """``(k, hash of messages[:k])`` for every k = 1..len(messages)."""
    h = start(context)
    for k, m in enumerate(messages, 1):
        fold(h, m)
        yield k, h.copy().digest()


def extend(context: str, messages: Sequence[dict], extra: dict) -> bytes:
    h = start(context)
    for m in messages:
        fold(h, m)
    fold(h, extra)
    return h.digest()
