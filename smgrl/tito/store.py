"""One session's capture tree: nodes, trajectories, GC and snapshots (docs/sessions.md). Pure, no locks:
the session service serialises access.

A node is one captured assistant turn, keyed by the hash of ``(render context, messages up to and
including that assistant message)``; its value is the turn's full ids (prompt + output), its parent's
hash, the turn record and the render text of its conversation (for the append-only proof).

Trajectory ids: ``manual`` takes the client's id; ``auto`` continues the smallest live trajectory
whose leaf is this turn's parent and that no turn in flight holds, else allocates the smallest free
id. An id is reserved from ``reserve`` until ``commit`` or ``release``.

Commit-time check (always on): a node with a stored parent must start with exactly the parent's
ids; otherwise ``PrefixMismatch`` and the caller stores it as a new root instead.

A node's ids longer than ``ids.PACK_AT`` are held as an ``array('i')`` (``ids.held``), whose items
the garbage collector never visits; shorter ones as a list. A snapshot carries each trajectory's ids
in the form its leaf holds them (``slices.encode_json`` writes both as the same JSON).
"""

from __future__ import annotations

import attrs

from smgrl.tito import ids
from smgrl.tito.merge import Prefix


class PrefixMismatch(Exception):
    pass


@attrs.define(eq=False)
class Node:
    hash: bytes
    parent: bytes | None
    token_ids: ids.Ids  # an array('i') when long (``ids.held``)
    record: dict
    render_text: str
    seq: int

    def as_prefix(self) -> Prefix:
        return Prefix(self.token_ids, self.render_text)


@attrs.define(eq=False)
class CaptureTree:
    strategy: str = "auto"  # "auto" | "manual"
    gc_threshold: int = 0  # 0 = collect after every store
    max_trim_tokens: int = 0
    entries: dict[bytes, Node] = attrs.field(factory=dict)
    leaves: set[bytes] = attrs.field(factory=set)
    trajectories: dict[int, bytes] = attrs.field(factory=dict)
    reserved: set[int] = attrs.field(factory=set)
    seq: int = 0
    stored_tokens: int = 0  # sum of len(token_ids) over entries (kept as they come and go)

    def lookup(self, h: bytes) -> Prefix | None:
        node = self.entries.get(h)
        return node.as_prefix() if node is not None else None

    def reserve(self, parent: bytes | None, requested: int | None = None) -> int:
        if self.strategy == "manual":
            tid = requested if requested is not None else 0
            self.reserved.add(tid)
            return tid
        if parent is not None:
            live = sorted(
                t for t, leaf in self.trajectories.items() if leaf == parent and t not in self.reserved
            )
            if live:
                self.reserved.add(live[0])
                return live[0]
        tid = 0
        while tid in self.trajectories or tid in self.reserved:
            tid += 1
        self.reserved.add(tid)
        return tid

    def release(self, tid: int) -> None:
        self.reserved.discard(tid)

    def commit(
        self,
        tid: int,
        h: bytes,
        parent: bytes | None,
        token_ids,
        record: dict,
        render_text: str,
        extends: bool | None = None,
    ) -> Node:
        """Store a captured turn under trajectory ``tid`` (reserved by ``reserve``). ``extends``:
        whether ``token_ids`` start with the parent's (``prefix_length``), when the caller
        compared them itself (a long turn's, in slices); None: compared here."""
        if parent is not None:
            p = self.entries.get(parent)
            if p is None:
                parent = None  # collected meanwhile: the turn is a root
            else:
                n = self.prefix_length(parent)
                ok = extends if extends is not None else ids.same_prefix(token_ids, p.token_ids, n)
                if not ok:
                    raise PrefixMismatch(f"turn does not extend its parent's {len(p.token_ids)} ids")
        self.seq += 1
        node = Node(h, parent, ids.held(token_ids), record, render_text, self.seq)
        if parent is not None:
            self.leaves.discard(parent)
        self.leaves.add(h)
        replaced = self.entries.get(h)
        if replaced is not None:
            self.stored_tokens -= len(replaced.token_ids)
        self.entries[h] = node
        self.stored_tokens += len(node.token_ids)
        self.trajectories[tid] = h
        self.reserved.discard(tid)
        self._gc()
        return node

    def prefix_length(self, parent: bytes) -> int:
        """How many of a stored node's ids a child's ids must start with (``commit``)."""
        p = self.entries.get(parent)
        return 0 if p is None else len(p.token_ids) - self.max_trim_tokens

    def _gc(self) -> None:
        if not self.trajectories:
            self.entries.clear()
            self.leaves.clear()
            self.stored_tokens = 0
            return
        if self.gc_threshold > 0 and len(self.entries) <= self.gc_threshold:
            return
        if len(self.leaves) <= len(self.trajectories):
            return
        keep: set[bytes] = set()
        for leaf in self.trajectories.values():
            h = leaf
            while h is not None and h not in keep and h in self.entries:
                keep.add(h)
                h = self.entries[h].parent
        self.entries = {h: n for h, n in self.entries.items() if h in keep}
        self.stored_tokens = sum(len(n.token_ids) for n in self.entries.values())
        self.leaves &= keep

    def path(self, leaf: bytes) -> list[Node]:
        out = []
        h = leaf
        while h is not None and h in self.entries:
            node = self.entries[h]
            out.append(node)
            h = node.parent
        out.reverse()
        return out

    def snapshot(self, session_id: str) -> dict:
        trajectories = []
        for tid in sorted(self.trajectories):
            leaf = self.trajectories[tid]
            nodes = self.path(leaf)
            trajectories.append(
                {
                    "trajectory_id": tid,
                    # A copy, of the form the node holds (an array of millions of ids is one
                    # memory copy; a list of them would be a million int objects on the loop).
                    "accumulated_token_ids": self.entries[leaf].token_ids[:] if leaf in self.entries else [],
                    "records": [dict(n.record) for n in nodes],
                }
            )
        return {
            "session_id": session_id,
            "max_trim_tokens": self.max_trim_tokens,
            "trajectories": trajectories,
        }

    def token_count(self) -> int:
        return self.stored_tokens
