"""A session turn of megabytes, driven from the loop: its pure stages in worker processes
(``offload``), its bulk in slices (``slices``). The session service hands such a turn here."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio
import trio_parallel

from smgrl.sessions import errors, offload, slices
from smgrl.tito import (
    Boundary,
    CaptureTree,
    ChatTokenizer,
    Rendered,
    TurnPlan,
    choose_prefix,
    hit_plan,
    miss_plan,
)

log = logging.getLogger("smgrl.sessions")


@attrs.frozen
class LargeTurn:
    """A turn whose body is prepared in worker processes (``LargeTurns.parse``): the body itself
    (what the workers read again) and what the first worker call rendered."""

    body: bytes
    parse: Callable[[bytes], dict]  # the route's own body check, run in the worker
    rendered: Rendered


class LargeTurns:
    def __init__(self, chat: ChatTokenizer, boundary: Boundary) -> None:
        self.chat = chat
        self.boundary = boundary
        # Only a tokenizer loaded from a directory, which a worker can load again.
        self.enabled = bool(chat.source)
        # At most two turns' work at once (2 cores: the other is the event loop's).
        self.limiter = trio.CapacityLimiter(2)

    async def run(self, fn, *args):
        """``fn(tokenizer path, fingerprint, *args)`` in a worker process. Cancellation (the
        client gone) kills the worker: its work is pure and nothing waits for it."""
        try:
            return await trio_parallel.run_sync(
                fn,
                self.chat.source,
                self.chat.fingerprint,
                *args,
                limiter=self.limiter,
                cancellable=True,
            )
        except offload.TokenizerChanged as exc:
            # The workers cannot load the tokenizer this process holds: later turns stay here.
            self.enabled = False
            log.warning("large turns stay in process from now on: %s", exc)
            raise errors.TurnAborted(
                "the tokenizer's files changed on disk while the turn was prepared; send it again"
            ) from None

    async def parse(self, body: bytes, parse: Callable[[bytes], dict]) -> tuple[dict, LargeTurn] | None:
        """A body over ``offload.PROCESS_BYTES`` parsed (by ``parse``), checked, rendered and
        hashed in a worker process: the body fields the loop uses and the turn; None when the
        turn is prepared in process (the caller parses the body itself)."""
        if not self.enabled or len(body) <= offload.PROCESS_BYTES:
            return None
        try:
            result = await self.run(offload.parse_and_render, parse, body)
        except errors.TurnAborted:
            return None  # the tokenizer changed on disk: prepared in process from now on
        _, fields, rendered = offload.raise_refusal(result)
        return fields, LargeTurn(body, parse, rendered)

    async def prepare(self, large: LargeTurn, s) -> TurnPlan:
        """``prepare_turn``'s stages with the pure ones in worker processes: the prefix chosen
        here against the session's tree (string comparisons of the render, single C calls), the
        appended segments or the whole render tokenized in a worker. The plan's ids are an
        ``array('i')`` (``smgrl.tito.ids``), never a list of int objects."""
        rendered = large.rendered
        choice = choose_prefix(rendered, s.tree.lookup)
        reason = choice.reason
        if choice.node is not None:
            segs = await self.run(offload.encode_segments, large.parse, large.body, choice.k)
            if segs is not None:
                segs = (slices.ids_array(segs[0]), segs[1])
            plan = hit_plan(self.boundary, rendered, choice, segs)
            if isinstance(plan, TurnPlan):
                return plan
            reason = plan
        ids = slices.ids_array(await self.run(offload.encode_text, rendered.full_text))
        return miss_plan(rendered, ids, reason)


async def extends(tree: CaptureTree, parent: bytes | None, token_ids) -> bool | None:
    """Whether a long turn's ids start with its parent's, compared in slices (the commit's
    check, which would compare millions of ids in one call); None: the commit compares."""
    node = tree.entries.get(parent) if parent is not None else None
    if node is None or len(token_ids) <= slices.SLICE:
        return None
    same = await slices.same_prefix(token_ids, node.token_ids, tree.prefix_length(parent))
    # Another turn may have replaced or collected the parent meanwhile: then the commit checks.
    return same if tree.entries.get(parent) is node else None
