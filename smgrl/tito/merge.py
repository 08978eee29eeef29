"""Building a turn's prompt ids: reuse the longest captured prefix, tokenize only what was appended.

``prepare_turn`` (docs/sessions.md, "How a turn is built", and its decisions):

1. Hash the conversation prefixes; candidates are the assistant boundaries before the last message;
   the longest one stored in the session is the hit.
2. Appended messages that contain an assistant turn (a compacted or edited history) are a miss:
   a rewritten history is never spliced onto a trajectory whose tokens it contradicts.
3. Always-on append-only proof (text level, no tokenization): the render of the stored prefix's
   conversation must be exactly the start of the render of the new request, and the appended
   segments must reproduce the rest of it. A template that rewrites earlier turns (e.g. one that
   strips old reasoning blocks) fails here and the turn starts a new branch (a miss).
4. Hit: ``boundary(prefix ids) ++ segments``. Each segment (a run of tool messages, or one other
   message) is rendered against a tiny dummy base and its ids are the ids of ``base + segment`` with
   the base's ids cut off (the cut must be exact, else a miss).
5. Miss: the full render, tokenized.

The boundary fix is derived from the template and the tokenizer (``Boundary.derive``): generation
stops at the end-of-turn token, while the template renders something after it (ChatML: ``"\\n"``);
the fix appends the ids of that text, or of the whole closing text when the turn did not end with the
end-of-turn token (a ``length`` finish). No vocabulary id is written down anywhere.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from smgrl.tito import hashing, ids
from smgrl.tito.chat import ChatTokenizer, TitoError

_PROBE = "\x1fA\x1f"  # assistant text that no template produces on its own


@attrs.frozen
class Boundary:
    """What the template renders after an assistant message's content."""

    close_text: str  # e.g. "<|im_end|>\n"
    after_eos_ids: tuple[int, ...]  # ids of the text after the end-of-turn token, e.g. ("\n",)
    close_ids: tuple[int, ...]  # ids of the whole closing text
    eos_id: int | None

    @classmethod
    def derive(cls, chat: ChatTokenizer) -> Boundary:
        msgs = [
            {"role": "system", "content": "_"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PROBE},
        ]
        text = chat.render(msgs)
        at = text.rfind(_PROBE)
        if at < 0:
            raise TitoError("chat_template_unsupported", "the chat template drops assistant content")
        close = text[at + len(_PROBE) :]
        eos = chat.eos_token
        if eos and close.startswith(eos):
            after = close[len(eos) :]
        else:
            after = close
        return cls(
            close_text=close,
            after_eos_ids=tuple(chat.encode(after)) if after else (),
            close_ids=tuple(chat.encode(close)) if close else (),
            eos_id=chat.eos_id,
        )

    def adjust(self, token_ids: Sequence[int]) -> ids.Ids:
        """Stored ``prompt + output`` ids -> ids of the same conversation as the template closes
        it (a copy, in the same form: an array stays one)."""
        out = token_ids[:] if ids.is_packed(token_ids) else list(token_ids)
        if self.eos_id is not None and out and out[-1] == self.eos_id:
            out.extend(self.after_eos_ids)
        else:
            out.extend(self.close_ids)
        return out


@attrs.frozen
class Prefix:
    """A captured node as the merge needs it."""

    token_ids: Sequence[int]
    render_text: str  # render(messages[:k]) without generation prompt, recorded at capture


@attrs.frozen
class TurnPlan:
    prompt_ids: ids.Ids  # an array('i') for a large turn, or a hit built on a long node
    hit: bool
    matched_messages: int  # k of the hit (0 on a miss)
    parent_hash: bytes | None  # the hit's node (None on a miss: a new root)
    reason: str  # "hit" | "no_prefix" | "assistant_in_appended" | "not_append_only" | ...
    full_text: str  # render of the request with the generation prompt
    context: str
    hashes: tuple[bytes, ...]  # hash of messages[:k] for k = 1..n


def split_segments(messages: Sequence[dict]) -> list[list[dict]]:
    """Each maximal run of tool messages is one segment; every other message is its own."""
    segs: list[list[dict]] = []
    for m in messages:
        if m.get("role") == "tool" and segs and segs[-1][-1].get("role") == "tool":
            segs[-1].append(m)
        else:
            segs.append([m])
    return segs


def _base_for(segment: list[dict]) -> list[dict]:
    base = [{"role": "system", "content": "_"}]
    if segment[0].get("role") == "tool":
        calls = [
            {
                "id": m.get("tool_call_id", ""),
                "type": "function",
                "function": {"name": "", "arguments": "{}"},
            }
            for m in segment
        ]
        base.append({"role": "assistant", "content": "", "tool_calls": calls})
    return base


def tokenize_segments(
    chat: ChatTokenizer, segments: list[list[dict]], *, tools, kwargs
) -> tuple[list[int], str] | None:
    """Ids and text of the appended segments, or None when the template is not append-only there."""
    seg_ids: list[int] = []
    texts: list[str] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        base = _base_for(seg)
        base_text = chat.render(base, tools=tools, kwargs=kwargs)
        full_text = chat.render(base + seg, tools=tools, kwargs=kwargs, add_generation_prompt=last)
        if not full_text.startswith(base_text):
            return None
        base_ids = chat.encode(base_text)
        full_ids = chat.encode(full_text)
        if full_ids[: len(base_ids)] != base_ids:
            return None  # a merge across the cut: the segment's ids are not separable
        seg_ids.extend(full_ids[len(base_ids) :])
        texts.append(full_text[len(base_text) :])
    return seg_ids, "".join(texts)


@attrs.frozen
class Rendered:
    """What a turn's messages give before any session state is read (``render_turn``): pure in
    the conversation, so it can be computed anywhere (a worker process for a large turn)."""

    context: str
    hashes: tuple[bytes, ...]  # hash of messages[:k] for k = 1..n
    full_text: str  # render of the request with the generation prompt
    roles: tuple  # each message's role, as the choice of a prefix reads them


def render_turn(chat: ChatTokenizer, messages: Sequence[dict], *, tools=None, kwargs=None) -> Rendered:
    if not messages:
        raise TitoError("invalid_messages", "messages must not be empty")
    context = hashing.render_context(tools, kwargs)
    hashes = tuple(h for _, h in hashing.prefix_hashes(context, messages))
    full_text = chat.render(messages, tools=tools, kwargs=kwargs, add_generation_prompt=True)
    return Rendered(context, hashes, full_text, tuple(m.get("role") for m in messages))


@attrs.frozen
class Choice:
    """The stored prefix a turn extends (``k`` messages, ``node``), or the reason it is a miss."""

    k: int
    node: Prefix | None
    reason: str  # "hit" (segments still to tokenize) or a miss's reason


def choose_prefix(rendered: Rendered, lookup: Callable[[bytes], Prefix | None]) -> Choice:
    """Steps 1-3 up to the segments: the longest stored assistant boundary, refused when an
    assistant message is appended after it or its render is not the start of the request's."""
    roles = rendered.roles
    for k in range(len(roles) - 1, 0, -1):
        if roles[k - 1] != "assistant":
            continue
        node = lookup(rendered.hashes[k - 1])
        if node is None or not node.token_ids:
            continue
        if any(r == "assistant" for r in roles[k:]):
            return Choice(0, None, "assistant_in_appended")
        if not rendered.full_text.startswith(node.render_text):
            return Choice(0, None, "not_append_only")
        return Choice(k, node, "hit")
    return Choice(0, None, "no_prefix")


def miss_plan(rendered: Rendered, prompt_ids: ids.Ids, reason: str) -> TurnPlan:
    # A long list packed here, where it was tokenized (a worker thread for a long turn).
    return TurnPlan(
        ids.compact(prompt_ids), False, 0, None, reason, rendered.full_text, rendered.context, rendered.hashes
    )


def hit_plan(
    boundary: Boundary, rendered: Rendered, choice: Choice, segs: tuple[ids.Ids, str] | None
) -> TurnPlan | str:
    """Step 4 once the appended segments are tokenized: the plan, or the miss's reason."""
    if segs is None:
        return "segments_not_append_only"
    seg_ids, seg_text = segs
    node = choice.node
    if node.render_text + seg_text != rendered.full_text:
        return "not_append_only"
    prompt = ids.joined(boundary.adjust(node.token_ids), seg_ids)
    k = choice.k
    return TurnPlan(
        prompt, True, k, rendered.hashes[k - 1], "hit", rendered.full_text, rendered.context, rendered.hashes
    )


def appended_segments(chat: ChatTokenizer, messages: Sequence[dict], k: int, *, tools, kwargs):
    """``tokenize_segments`` of the messages after the first ``k`` (None: not append-only)."""
    try:
        return tokenize_segments(chat, split_segments(messages[k:]), tools=tools, kwargs=kwargs)
    except TitoError:
        return None


def prepare_turn(
    chat: ChatTokenizer,
    boundary: Boundary,
    messages: Sequence[dict],
    *,
    tools=None,
    kwargs=None,
    lookup: Callable[[bytes], Prefix | None],
) -> TurnPlan:
    """The whole turn in one call (the stages above, run here; a large turn runs them with its
    pure stages in a worker process, smgrl/sessions/offload.py)."""
    rendered = render_turn(chat, messages, tools=tools, kwargs=kwargs)
    choice = choose_prefix(rendered, lookup)
    if choice.node is not None:
        plan = hit_plan(
            boundary,
            rendered,
            choice,
            appended_segments(chat, messages, choice.k, tools=tools, kwargs=kwargs),
        )
        if isinstance(plan, TurnPlan):
            return plan
        return miss_plan(rendered, chat.encode(rendered.full_text), plan)
    return miss_plan(rendered, chat.encode(rendered.full_text), choice.reason)
