"""Large session turns: their pure work in worker processes, their bulk on the loop in slices.

A worker thread is not enough for a turn of megabytes: rendering, hashing and the Python side of
tokenizing hold the GIL (tokenizers releases it while it encodes, not while it builds the list of
ids), and so does every long C call (``json.loads``, ``json.dumps`` of a million ids), and the
event loop waits for the GIL as it would for the work itself (measured: ``/health`` 0.5-9 s
late). So a turn whose body is over ``PROCESS_BYTES`` is prepared in a ``trio_parallel`` worker
process, in three calls that take and give back only flat values (bytes, one string, a few
small dicts: pickling them is a copy on the loop):

- ``parse_and_render`` (before the session's hang gate): the body parsed and checked as the
  route checks it, then rendered and hashed (``smgrl.tito.render_turn``: nothing of the session
  is read). The loop gets the few body fields it uses, never the messages.
- ``encode_text`` (a miss) or ``encode_segments`` (a hit: the messages after the stored prefix),
  chosen on the loop by ``choose_prefix`` against the session's tree.
- ``close_in_worker`` (after the engine answered): the captured node's hash and render text.

The ids come back as the bytes of an ``array('i')`` and stay that array on the loop, in the plan,
the engine request and the capture tree (``slices.ids_array``; ``smgrl.tito.ids``: the garbage
collector does not walk an array's items, where each collection visits every id of a list); the engine's JSON body is encoded in slices with a checkpoint between them
(``encode_ids``), as is the commit's prefix comparison (``same_prefix``): ``slices``. Each worker loads
the tokenizer once, by path, and proves it read the files the gateway read (the fingerprint of
``ChatTokenizer.load``); a tokenizer built in memory has no path and its turns stay in a thread.
"""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

from smgrl.sessions.checks import check_messages, check_tools
from smgrl.sessions.engine import SENT
from smgrl.sessions.errors import InvalidTurn, TemplateRefused
from smgrl.tito import (
    Boundary,
    ChatTokenizer,
    TitoError,
    appended_segments,
    close_turn,
    render_turn,
)

# A body longer than this is parsed, rendered and tokenized in a worker process. Below it a
# thread does it (the GIL held for at most a few ms at a time at this size).
PROCESS_BYTES = 256 * 1024
# The body fields the loop uses (the engine's sampling fields, the answer's shape): the rest
# (messages, tools, template kwargs) stays in the worker. The sampling fields are the OpenAI
# routes' less those a session turn never sends its engine (sessions/engine.py says why).
LOOP_FIELDS = (
    "model",  # the answer names the model
    "stream",  # the answer's shape: a stream or one object (the engine's call is one object)
    "stream_options",  # a streamed answer's usage chunk (include_usage)
    "max_tokens",  # the turn's limit (sessions.engine.max_tokens): a continuation sets what is left
    "max_completion_tokens",  # the same, as chat completions names it
    *SENT,
)
_REFUSALS = {"invalid_turn": InvalidTurn, "chat_template_error": TemplateRefused}
# What a template meeting a value it cannot render raises (the checks cover the known shapes).
RENDER_ERRORS = (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError)


class TokenizerChanged(Exception):
    """The worker read other tokenizer files than the gateway did (changed on disk since)."""


def turn_inputs(body: dict) -> tuple[list[dict], list | None, dict]:
    """The messages, tools and template kwargs of a turn's body (InvalidTurn without messages)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidTurn("`messages` must be a non-empty list of message objects")
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    raw = body.get("chat_template_kwargs")
    kwargs = dict(raw) if isinstance(raw, dict) else {}
    if body.get("reasoning_effort") is not None:
        kwargs.setdefault("reasoning_effort", body["reasoning_effort"])
    return messages, tools, kwargs


def refusal(exc: BaseException) -> InvalidTurn | TemplateRefused | None:
    """The turn's refusal for an exception of its preparation, None when it is not one."""
    if isinstance(exc, (InvalidTurn, TemplateRefused)):
        return exc
    if isinstance(exc, TitoError):
        return TemplateRefused(exc.message)
    if isinstance(exc, RENDER_ERRORS):
        return TemplateRefused(f"the chat template could not render the conversation ({type(exc).__name__})")
    return None


# -- in the worker process ------------------------------------------------------------------------

_LOADED: dict[tuple[str, str], tuple[ChatTokenizer, Boundary]] = {}


def _chat(path: str, fingerprint: str) -> ChatTokenizer:
    """The tokenizer, loaded once per worker process (the gateway's, proved by its fingerprint)."""
    got = _LOADED.get((path, fingerprint))
    if got is None:
        chat = ChatTokenizer.load(path)
        if chat.fingerprint != fingerprint:
            raise TokenizerChanged(f"{path} changed since the gateway loaded it")
        got = _LOADED[(path, fingerprint)] = (chat, Boundary.derive(chat))
    return got[0]


def _inputs(parse: Callable[[bytes], dict], body: bytes) -> tuple[list[dict], list | None, dict]:
    messages, tools, kwargs = turn_inputs(parse(body))
    return messages, tools, kwargs or None


def _refused(exc: BaseException) -> tuple[str, str]:
    # Exceptions cross the process boundary as (code, message): the classes are rebuilt on the loop.
    r = refusal(exc)
    if r is None:
        raise exc
    return ("refused", r.code, r.message)


def parse_and_render(path: str, fingerprint: str, parse: Callable[[bytes], dict], body: bytes) -> tuple:
    """("ok", loop fields, Rendered) or ("refused", code, message)."""
    try:
        obj = parse(body)
        messages, tools, kwargs = turn_inputs(obj)
        check_messages(messages)
        check_tools(tools)
        rendered = render_turn(_chat(path, fingerprint), messages, tools=tools, kwargs=kwargs or None)
    except Exception as exc:  # noqa: BLE001 - each refusal becomes its code; anything else re-raised
        return _refused(exc)
    return ("ok", {k: obj[k] for k in LOOP_FIELDS if k in obj}, rendered)


def encode_text(path: str, fingerprint: str, text: str) -> bytes:
    return array.array("i", _chat(path, fingerprint).encode(text)).tobytes()


def encode_segments(path: str, fingerprint: str, parse, body: bytes, k: int) -> tuple[bytes, str] | None:
    """The ids (as bytes) and text of the messages after the first ``k``, None when the
    template is not append-only there."""
    chat = _chat(path, fingerprint)
    messages, tools, kwargs = _inputs(parse, body)
    segs = appended_segments(chat, messages, k, tools=tools, kwargs=kwargs)
    if segs is None:
        return None
    return array.array("i", segs[0]).tobytes(), segs[1]


def close_in_worker(path: str, fingerprint: str, parse, body: bytes, context: str, assistant: dict):
    chat = _chat(path, fingerprint)
    messages, tools, kwargs = _inputs(parse, body)
    return close_turn(chat, context, messages, assistant, tools, kwargs)


def raise_refusal(result: tuple) -> Any:
    """A worker call's value, or its refusal raised here."""
    if isinstance(result, tuple) and result and result[0] == "refused":
        raise _REFUSALS.get(result[1], InvalidTurn)(result[2])
    return result
