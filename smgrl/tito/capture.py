"""From generated ids to the assistant message, the captured node and (debug) its validation.

- ``assistant_message``: decode the output ids, drop the end-of-turn token, parse tool calls; the
  gateway answers the agent with exactly this message, so the agent's echo hashes the same.
- ``captured``: the node key (the request's hash extended with that message), the full ids
  (prompt + output), the render text of the conversation it closes (no generation prompt) and the
  turn record (docs/sessions.md, "The snapshot and the training arrays", plus smgrl's ``weight_versions`` spans and ``engine``).
- ``validate``: the debug-mode comparison of merged ids against a full render's ids (a simplified
  port of SMG's validator): both sequences are split into special-token and content segments;
  a different structure is ``special_token_count``, a different special id ``special_token_type``,
  different content text ``assistant_text`` (benign: the model's own ids need not re-tokenize the
  same) when it follows the generation prompt's marker, else ``non_assistant_text``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from smgrl.tito import hashing
from smgrl.tito.chat import ChatTokenizer
from smgrl.tito.ids import Ids, joined
from smgrl.tito.merge import Boundary, TurnPlan
from smgrl.tito.toolcalls import ToolCallParser, strip_eos


def assistant_message(chat: ChatTokenizer, parser: ToolCallParser, output_ids: Sequence[int]) -> dict:
    text = strip_eos(chat.decode(output_ids), chat.eos_token)
    parsed = parser.parse(text)
    msg: dict = {"role": "assistant", "content": parsed.content if parsed.tool_calls else text}
    if parsed.tool_calls:
        msg["tool_calls"] = [dict(tc) for tc in parsed.tool_calls]
    return msg


def close_turn(
    chat: ChatTokenizer, context: str, messages, assistant: dict, tools, kwargs
) -> tuple[bytes, str]:
    """The captured node's key and the render of the conversation it closes (no generation prompt)."""
    h = hashing.extend(context, messages, assistant)
    return h, chat.render(list(messages) + [assistant], tools=tools, kwargs=kwargs)


@attrs.frozen
class CapturedTurn:
    hash: bytes
    parent: bytes | None
    token_ids: Ids  # an array('i') when long (``joined``)
    render_text: str
    record: dict


def captured(
    chat: ChatTokenizer,
    plan: TurnPlan,
    messages: Sequence[dict],
    assistant: dict,
    *,
    tools,
    kwargs,
    output_ids: Sequence[int],
    output_logprobs: Sequence[float] | None,
    finish_reason: str,
    weight_version: str | None,
    weight_versions: Sequence[dict] = (),
    engine: str | None = None,
    routed_experts: dict | None = None,
    mismatch_report: Sequence[dict] = (),
    closed: tuple[bytes, str] | None = None,
) -> CapturedTurn:
    """``closed``: the node's hash and render text (``close_turn``) when computed elsewhere (a
    large turn's, in a worker process); ``messages`` are then not read."""
    h, render_text = (
        closed if closed is not None else close_turn(chat, plan.context, messages, assistant, tools, kwargs)
    )
    record: dict = {
        "prompt_token_count": len(plan.prompt_ids),
        "output_logprobs": (
            [[float(lp), int(t)] for lp, t in zip(output_logprobs, output_ids, strict=True)]
            if output_logprobs is not None
            else None
        ),
        "finish_reason": finish_reason,
        "mismatch_report": list(mismatch_report),
    }
    if weight_version is not None:
        record["weight_version"] = weight_version
    if weight_versions:
        record["weight_versions"] = [dict(s) for s in weight_versions]
    if engine is not None:
        record["engine"] = engine
    if routed_experts is not None:
        record["routed_experts"] = routed_experts
    return CapturedTurn(h, plan.parent_hash, joined(plan.prompt_ids, output_ids), render_text, record)


def _segments(ids: Sequence[int], special: frozenset[int]) -> list[tuple[bool, list[int]]]:
    out: list[tuple[bool, list[int]]] = []
    for t in ids:
        is_special = t in special
        if is_special or not out or out[-1][0]:
            out.append((is_special, [t]))
        else:
            out[-1][1].append(t)
    return out


def _assistant_marker(chat: ChatTokenizer) -> tuple[int | None, str]:
    """The special id and text that open an assistant turn, from the template's generation prompt."""
    base = [{"role": "system", "content": "_"}]
    closed = chat.render(base)
    opened = chat.render(base, add_generation_prompt=True)
    ids = chat.encode(opened[len(closed) :]) if opened.startswith(closed) else []
    if ids and ids[0] in chat.special_ids:
        return ids[0], chat.decode(ids[1:])
    return None, ""


def validate(
    chat: ChatTokenizer, boundary: Boundary, merged: Sequence[int], expected: Sequence[int]
) -> list[dict]:
    """Mismatches between merged ids and the full render's ids (empty = identical)."""
    if list(merged) == list(expected):
        return []
    tail = set(boundary.after_eos_ids)

    def trimmed(ids):
        ids = list(ids)
        while ids and ids[-1] in tail:
            ids.pop()
        return ids

    a, b = _segments(trimmed(merged), chat.special_ids), _segments(trimmed(expected), chat.special_ids)
    if [s for s, _ in a] != [s for s, _ in b]:
        return [
            {
                "mismatch_type": "special_token_count",
                "position": 0,
                "detail": f"{len(a)} vs {len(b)} segments",
            }
        ]
    marker_id, marker_text = _assistant_marker(chat)
    report = []
    pos = 0
    prev: list[int] = []
    for (special, xa), (_, xb) in zip(a, b, strict=True):
        if special and xa != xb:
            report.append({"mismatch_type": "special_token_type", "position": pos, "detail": f"{xa} vs {xb}"})
        elif not special:
            ta, tb = chat.decode(xa), chat.decode(xb)
            if ta != tb:
                in_assistant = marker_id is not None and prev == [marker_id] and ta.startswith(marker_text)
                kind = "assistant_text" if in_assistant else "non_assistant_text"
                report.append(
                    {"mismatch_type": kind, "position": pos, "detail": f"{len(xa)} vs {len(xb)} ids"}
                )
        pos += len(xa)
        prev = xa
    return report
