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

from smgrl.tito import hashing
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

    def adjust(self, ids: Sequence[int]) -> list[int]:
        """Stored ``prompt + output`` ids -> ids of the same conversation as the template closes it."""
        out = list(ids)
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
    prompt_ids: list[int]
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
    ids: list[int] = []
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
        ids.extend(full_ids[len(base_ids) :])
        texts.append(full_text[len(base_text) :])
    return ids, "".join(texts)


def prepare_turn(
    chat: ChatTokenizer,
    boundary: Boundary,
    messages: Sequence[dict],
    *,
    tools=None,
    kwargs=None,
    lookup: Callable[[bytes], Prefix | None],
) -> TurnPlan:
    if not messages:
        raise TitoError("invalid_messages", "messages must not be empty")
    context = hashing.render_context(tools, kwargs)
    hashes = tuple(h for _, h in hashing.prefix_hashes(context, messages))
    full_text = chat.render(messages, tools=tools, kwargs=kwargs, add_generation_prompt=True)

    def miss(reason: str) -> TurnPlan:
        return TurnPlan(chat.encode(full_text), False, 0, None, reason, full_text, context, hashes)

    n = len(messages)
    candidates = [k for k in range(n - 1, 0, -1) if messages[k - 1].get("role") == "assistant"]
    for k in candidates:
        node = lookup(hashes[k - 1])
        if node is None or not node.token_ids:
            continue
        appended = messages[k:]
        if any(m.get("role") == "assistant" for m in appended):
            return miss("assistant_in_appended")
        if not full_text.startswith(node.render_text):
            return miss("not_append_only")
        try:
            segs = tokenize_segments(chat, split_segments(appended), tools=tools, kwargs=kwargs)
        except TitoError:
            segs = None
        if segs is None:
            return miss("segments_not_append_only")
        seg_ids, seg_text = segs
        if node.render_text + seg_text != full_text:
            return miss("not_append_only")
        prompt = boundary.adjust(node.token_ids) + seg_ids
        return TurnPlan(prompt, True, k, hashes[k - 1], "hit", full_text, context, hashes)
    return miss("no_prefix")
