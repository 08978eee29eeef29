"""Read a rollout request's body as SMG 1.13.0 does, and refuse it with SMG's codes (pure).

SMG deserializes ``/v1/chat/completions`` and ``/v1/completions`` bodies into typed structs
(serde, through axum's ``Json`` and its ``ValidatedJson``), validates them, and only then looks
the model up; clients and retry logic key on the ``code`` it answers (``invalid_json``,
``invalid_type``, ``missing_required_parameter``...) and on ``param``. This module gives the same
answers for the fields listed in ``CHAT_FIELDS`` / ``COMPLETION_FIELDS`` (the fields SMG types
that a rollout client commonly sends; the others, tools and response formats among them, are
the engine's to judge: docs/deviations.md).

Cost: a valid body is parsed once by the stdlib's C parser and its known fields type-checked on
the parsed dict (``smgrl.http.bodies.serde_body.fast_parse``, the fast path every serde-read body takes).
Only when that check finds something wrong (or the body holds what Python reads and serde
refuses: a lone surrogate escape, NaN, -0 for an integer, a repeated field, a BOM, deeper nesting
than serde's 128 levels) does ``smgrl.http.bodies.serde_body`` re-read the bytes with serde's rules to
name the first error in document order, with its path and position, as SMG does.

``/generate`` stays lenient (docs/deviations.md): any JSON object with a string (or no) ``model``
is forwarded; SGLang judges the rest. Its refusals use the same codes in the same JSON envelope
(SMG answers axum's plain-text rejections there).
"""

from __future__ import annotations

import json
import re
from typing import Any

from smgrl.core.errors import InvalidRequest
from smgrl.dataplane import CHAT, COMPLETIONS, GENERATE, RolloutRequest, from_obj
from smgrl.http.bodies.serde_body import MAX_DEPTH, SerdeError, fast_parse, field_ok, serde_struct

# SMG's field types (crates/protocols: ChatCompletionRequest, CompletionRequest); kinds as in
# smgrl.http.bodies.serde_body. ``bool_nf``: null reads as false (SMG's deserialize_null_as_false).
_SAMPLING = {
    "model": "str",
    "frequency_penalty": "opt_f32",
    "presence_penalty": "opt_f32",
    "temperature": "opt_f32",
    "top_p": "opt_f32",
    "min_p": "opt_f32",
    "repetition_penalty": "opt_f32",
    "logit_bias": "opt_map_f32",
    "max_tokens": "opt_u32",
    "n": "opt_u32",
    "min_tokens": "opt_u32",
    "top_k": "opt_i32",
    "seed": "opt_i64",
    "sampling_seed": "opt_u64",
    "stop": "opt_untagged:StringOrArray",
    "stream": "bool_nf",
    "stream_options": "opt_map",
    "regex": "opt_str",
    "ebnf": "opt_str",
    "lora_path": "opt_str",
    "rid": "opt_str",
    "no_stop_trim": "bool",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "return_hidden_states": "bool",
    "session_params": "opt_map",
}
CHAT_FIELDS = {
    **_SAMPLING,
    "messages": "messages",
    "logprobs": "bool_nf",
    "max_completion_tokens": "opt_u32",
    "top_logprobs": "opt_u32",
    "metadata": "opt_map_str",
    "parallel_tool_calls": "opt_bool",
    "prompt_cache_key": "opt_str",
    "safety_identifier": "opt_str",
    "service_tier": "opt_str",
    "verbosity": "opt_i32",
    "continue_final_message": "bool",
    "separate_reasoning": "bool",
    "stream_reasoning": "bool",
    "chat_template_kwargs": "opt_map",
}
COMPLETION_FIELDS = {
    **_SAMPLING,
    # SMG: StringOrArray (text only); smgrl also forwards token-id prompts (docs/deviations.md).
    "prompt": "untagged:StringOrArray|ids",
    "best_of": "opt_u32",
    "echo": "bool",
    "logprobs": "opt_u32",
    "suffix": "opt_str",
    "user": "opt_str",
    "json_schema": "opt_str",
}
GENERATE_FIELDS = {"model": "opt_str"}
# A session turn (smgrl/http/fronts/sessions.py): a chat completion's body, checked as the OpenAI
# route checks it (one validation for both), except that ``model`` may be left out or null (the
# gateway resolves it: PSRL's SessionRouter sends none).
SESSION_TURN = "session turn"
SCHEMAS = {
    SESSION_TURN: ("ChatCompletionRequest", {**CHAT_FIELDS, "model": "opt_str"}, ("messages",)),
    CHAT: ("ChatCompletionRequest", CHAT_FIELDS, ("messages", "model")),
    COMPLETIONS: ("CompletionRequest", COMPLETION_FIELDS, ("model", "prompt")),
    GENERATE: ("GenerateRequest", GENERATE_FIELDS, ()),
}
# serde's error texts -> SMG's codes (its classification of serde errors, checked in order).
_CODES = (
    ("missing field `", "missing_required_parameter"),
    ("unknown field `", "unknown_parameter"),
    ("unknown variant `", "invalid_value"),
    ("invalid value: integer `-", "integer_below_min_value"),
    ("invalid value", "invalid_value"),
    ("invalid type", "invalid_type"),
    ("invalid length", "invalid_value"),
    ("data did not match any variant", "invalid_type"),
)
MISSING_CONTENT_TYPE = "Missing Content-Type: application/json header"
# A lone surrogate escape (a high one not followed by a low one, or a low one alone): serde
# refuses it, Python does not. Pairs (emoji escaped by ensure_ascii encoders) stay on the fast path.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
# serde's reading (for SMG's exact text and position) is pure Python: above this size a refused
# body gets the same code and param from the fast check, without serde's position (it would
# hold the event loop for seconds on a body at --dataplane-max-body-size).
EXACT_TEXT_LIMIT = 1 << 20


def _str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _ids(v: Any) -> bool:
    return type(v) is list and all(type(x) is int for x in v)


def untagged_ok(name: str, value: Any) -> bool:
    if name == "StringOrArray":
        return type(value) is str or _str_list(value)
    if name == "StringOrArray|ids":
        return (
            type(value) is str
            or _str_list(value)
            or _ids(value)
            or (type(value) is list and all(_ids(x) for x in value))
        )
    return True


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity: not JSON (serde refuses them)


def _too_deep(obj: Any) -> bool:
    """Nested deeper than serde's limit (the root counts as one level)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return True
        children = value.values() if type(value) is dict else value
        for child in children:
            if type(child) in (dict, list):
                stack.append((child, depth + 1))
    return False


def _fast(route: str, body: bytes) -> Any:
    """The parsed body when the C parser alone can be trusted to agree with serde, else None
    (``smgrl.http.bodies.serde_body.fast_parse``: the checks every serde-read body gets)."""
    _name, fields, required = SCHEMAS[route]
    parsed = fast_parse(body, fields, required, flatten=True, untagged_ok=untagged_ok)
    return None if parsed is None else parsed[0]


def _refusal(route: str, exc: SerdeError) -> InvalidRequest:
    openai = route != GENERATE
    if exc.syntax:
        text = f"Failed to parse the request body as JSON: {exc.message}"
        return InvalidRequest(f"JSON syntax error: {text}" if openai else text, "invalid_json")
    text = f"Failed to deserialize the JSON body into the target type: {exc.message}"
    code = next((c for prefix, c in _CODES if prefix in exc.message), "json_parse_error")
    param = exc.path or None
    if code == "missing_required_parameter":
        field = exc.message.split("`")[1]
        param = f"{param}.{field}" if param else field
    elif code == "json_parse_error":
        param = None
    if not openai:
        # axum's status for a body of the wrong shape (SMG answers it in plain text).
        return InvalidRequest(text, code, param, status=422)
    return InvalidRequest(f"Invalid JSON data: {text}", code, param)


def _validate(route: str, obj: dict[str, Any]) -> None:
    """SMG's checks after deserializing (``validator``), those with stable texts."""
    if route == CHAT and not obj["messages"]:
        raise InvalidRequest(
            "messages: Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "empty_array",
            "messages",
        )
    if route == COMPLETIONS and obj["prompt"] == []:
        raise InvalidRequest("prompt: prompt array cannot be empty", "prompt_empty", "prompt")


def json_content_type(value: bytes | None) -> bool:
    """axum's rule: ``application/json`` or ``application/*+json``, parameters allowed."""
    if not value:
        return False
    mime = value.split(b";", 1)[0].strip().lower()
    kind, _, sub = mime.partition(b"/")
    return kind == b"application" and (sub == b"json" or sub.endswith(b"+json"))


def parse(route: str, body: bytes, content_type: bytes | None) -> RolloutRequest:
    """The rollout request, or InvalidRequest with SMG's code, ``param`` and message."""
    if route != GENERATE and not json_content_type(content_type):
        raise InvalidRequest(MISSING_CONTENT_TYPE, "json_parse_error")
    obj = _checked(route, body)
    if route != GENERATE:
        _validate(route, obj)
    return from_obj(route, obj)


def parse_turn(body: bytes) -> dict[str, Any]:
    """A session turn's body as a dict, or InvalidRequest with the code and ``param`` the OpenAI
    chat route would answer (``model`` optional; the session service checks the messages)."""
    return _checked(SESSION_TURN, body)


def _checked(route: str, body: bytes) -> Any:
    obj = _fast(route, body)
    if obj is None and len(body) > EXACT_TEXT_LIMIT:
        raise _approximate(route, body)
    if obj is None:
        name, fields, required = SCHEMAS[route]
        try:
            serde_struct(body, name, fields, required, flatten=True, untagged_ok=untagged_ok)
        except SerdeError as exc:
            raise _refusal(route, exc) from None
        # serde accepts what the fast check doubted (e.g. a valid surrogate pair).
        obj = json.loads(body)
    return obj


def _approximate(route: str, body: bytes) -> InvalidRequest:
    """A large body's refusal from the C parser and the field checks: SMG's code and ``param``,
    serde's wording where it is known, no position (docs/deviations.md)."""
    openai = route != GENERATE
    try:
        obj = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        text = f"Failed to parse the request body as JSON: {exc}"
        return InvalidRequest(f"JSON syntax error: {text}" if openai else text, "invalid_json")
    if _LONE_SURROGATE.search(body):
        text = "Failed to parse the request body as JSON: lone surrogate in hex escape"
        return InvalidRequest(f"JSON syntax error: {text}" if openai else text, "invalid_json")
    if type(obj) in (dict, list) and _too_deep(obj):
        text = "Failed to parse the request body as JSON: recursion limit exceeded"
        return InvalidRequest(f"JSON syntax error: {text}" if openai else text, "invalid_json")
    name, fields, required = SCHEMAS[route]
    if type(obj) is not dict:
        return _data_error(
            route, f"invalid type: {type(obj).__name__}, expected struct {name}", "invalid_type", None
        )
    for field in required:
        if field not in obj:
            return _data_error(route, f"missing field `{field}`", "missing_required_parameter", field)
    for key, value in obj.items():
        kind = fields.get(key)
        if kind is not None and not field_ok(kind, value, untagged_ok):
            return _data_error(route, f"{key}: invalid type", "invalid_type", key)
    # The fast check doubted a detail only serde's reading shows (a duplicate field...).
    return _data_error(route, "the body does not match the request's fields", "json_parse_error", None)


def _data_error(route: str, detail: str, code: str, param: str | None) -> InvalidRequest:
    text = f"Failed to deserialize the JSON body into the target type: {detail}"
    if route == GENERATE:
        return InvalidRequest(text, code, param, status=422)
    return InvalidRequest(f"Invalid JSON data: {text}", code, param)
