"""The hash chain, shared by every store so that they cannot disagree on it.

Each row's hash is::

    sha256(prev_hash + "\\n" + f"{seq}\\n{ts!r}\\n{stream}\\n{type}\\n{schema}\\n" + hashed_payload)

in lowercase hex over UTF-8, with ``prev_hash`` of the first row = 64 zeros. ``hashed_payload`` is
the stored payload itself, except for a ``control.started`` row that still holds its request
body: there it is the canonical payload with ``"body": null``. The body is bound to the chain
through ``body_sha256`` (which *is* hashed), and verify checks every kept body against it. This
is what makes body compaction possible without breaking the chain: a compacted payload is
byte-for-byte the hashed form. See ``journal/store.py`` for the whole scheme.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import attrs

from .codec import ControlStarted, Event, Recorded, UnknownEvent, _body_bytes, _dumps, encode

GENESIS = "0" * 64
BODY_EVENT = ControlStarted.TYPE
_KEPT_ENCODINGS = ("utf8", "base64")


class Prepared(NamedTuple):
    """An event encoded for storage (computed once, in the caller's task, when the Append is built)."""

    type: str
    schema: int
    payload: str
    hashed_utf8: bytes  # the hashed payload, already UTF-8: encoded once, hashed in the writer thread


def chain_hash(
    prev_hash: str, seq: int, ts: float, stream: str, type_: str, schema: int, hashed_utf8: bytes
) -> str:
    header = f"{prev_hash}\n{seq}\n{ts!r}\n{stream}\n{type_}\n{schema}\n".encode()
    return hashlib.sha256(header + hashed_utf8).hexdigest()


def hashed_payload(type_: str, payload: str, obj: Any) -> str:
    """The text the chain hashes for a row whose payload parses to ``obj`` (see module docstring)."""
    if type_ == BODY_EVENT and isinstance(obj, dict) and obj.get("body") is not None:
        return _dumps({**obj, "body": None})
    return payload


def body_problem(obj: dict[str, Any]) -> str | None:
    """Why a control.started payload's kept body is inconsistent, or None if it is fine."""
    try:
        raw = _body_bytes(obj.get("body"), obj.get("body_encoding"))
    except (ValueError, TypeError) as exc:  # ValueError includes binascii.Error
        return f"undecodable body: {exc}"
    if raw is None:
        return None
    if hashlib.sha256(raw).hexdigest() != obj.get("body_sha256") or len(raw) != obj.get("body_size"):
        return "body does not match body_sha256/body_size"
    return None


def _hashed_started(event: ControlStarted, payload: str) -> str:
    """``hashed_payload`` of a control.started that holds its body, from the event itself.

    The payload is canonical JSON with sorted keys, so ``"body"`` is its first key: the hashed form
    is the same text with that value replaced by ``null`` (what parsing the payload and encoding
    it again with ``"body": None`` gives, without the two passes over the targets: about half of
    an 8-engine fan-out intent's encoding). The body is checked against ``body_sha256`` and
    ``body_size`` from the event's fields, which the payload encodes."""
    problem = body_problem(
        {
            "body": event.body,
            "body_encoding": event.body_encoding,
            "body_sha256": event.body_sha256,
            "body_size": event.body_size,
        }
    )
    if problem is not None:
        raise ValueError(f"control.started: {problem}")
    head = '{"body":' + _dumps(event.body)
    if not payload.startswith(head + ',"body_encoding":'):  # pragma: no cover - not canonical
        return hashed_payload(BODY_EVENT, payload, json.loads(payload))
    return '{"body":null' + payload[len(head) :]


def prepare(event: Event | UnknownEvent, stream: str) -> Prepared:
    """Encode an event for the chain, raising (in the caller's task) anything a store would choke on."""
    type_, schema, payload = encode(event)
    hashed = payload
    # A control.started without a kept body (empty, too large, compacted) has nothing to check and
    # hashes its payload as it is: parsing the payload back (its targets: about 40 us for 64
    # engines) is only needed when the event holds a body.
    if type(event) is ControlStarted and event.body is not None:
        hashed = _hashed_started(event, payload)
    elif type_ == BODY_EVENT and not (type(event) is ControlStarted and event.body is None):
        obj = json.loads(payload)
        if isinstance(obj, dict):
            problem = body_problem(obj)
            if problem is not None:
                raise ValueError(f"control.started: {problem}")
            hashed = hashed_payload(type_, payload, obj)
    # Lone surrogates survive json.dumps(ensure_ascii=False) but not UTF-8 (nor SQLite): encoding
    # here makes them fail in the caller.
    stream.encode("utf-8")
    return Prepared(type_, schema, payload, hashed.encode("utf-8"))


@attrs.frozen(slots=True)
class VerifyReport:
    """Result of recomputing the hash chain. ``checked`` counts rows found intact before the first bad one."""

    ok: bool
    checked: int
    first_bad_seq: int | None
    reason: str | None


class Head(NamedTuple):
    seq: int
    ts: float
    hash: str


EMPTY_HEAD = Head(0, 0.0, GENESIS)


class Batchable(Protocol):
    """What a batch item offers (``journal.base.Append``; named by its shape, so that this module,
    which the store contract builds on, does not import it back)."""

    @property
    def stream(self) -> str: ...
    @property
    def event(self) -> Any: ...
    @property
    def secrets(self) -> Any: ...
    @property
    def _prepared(self) -> Prepared: ...


Row = tuple[int, float, str, str, int, str, str, str]  # seq, ts, stream, type, schema, payload, prev, hash
SecretOp = tuple[str, "str | None", int]  # worker_id, api_key (None: delete), seq


def build_batch(
    items: Sequence[Batchable], head: Head, now: float
) -> tuple[list[Row], list[Recorded], list[SecretOp]]:
    """Rows, receipts and secret writes for one batch appended after ``head``.

    One ts for the whole batch: the commit time, clamped so ts never goes backwards (clock steps),
    which lets readers turn a time range into a seq range.
    """
    ts = max(head.ts, now)
    ts_text = repr(ts)  # formatted once per batch, not per row
    sha256 = hashlib.sha256
    seq, prev = head.seq, head.hash
    rows: list[Row] = []
    recorded: list[Recorded] = []
    secret_ops: list[SecretOp] = []
    for item in items:
        seq += 1
        stream = item.stream
        type_, schema, payload, hashed = item._prepared
        # chain_hash(), inlined in this hot loop (verify recomputes every row with chain_hash itself,
        # so the two cannot drift apart unnoticed: the contract tests verify after every append).
        h = sha256(f"{prev}\n{seq}\n{ts_text}\n{stream}\n{type_}\n{schema}\n".encode() + hashed).hexdigest()
        rows.append((seq, ts, stream, type_, schema, payload, prev, h))
        recorded.append(Recorded(seq, ts, stream, item.event, h))
        if item.secrets:
            secret_ops.extend((worker_id, api_key, seq) for worker_id, api_key in item.secrets.items())
        prev = h
    return rows, recorded, secret_ops


def snapshot_hash(kind: str, upto_seq: int, anchor: str, state_json: str) -> str:
    """A snapshot is bound to the chain hash of its upto_seq row: rewrite history and it is ignored."""
    return hashlib.sha256(f"{kind}\n{upto_seq}\n{anchor}\n{state_json}".encode()).hexdigest()


OnRow = Callable[[int, str, int, Any], None]  # seq, type, schema, parsed payload


class Marks(NamedTuple):
    """What a store records beside its rows, read in one snapshot (one statement, or under the lock)."""

    high_water: Head  # the head, written in the same transaction as every batch
    compacted_before: int  # bodies of control.started rows below this seq may have been compacted
    last_seq: int  # the last row actually present


_BODY_REMOVED = "request body removed outside compaction"


def verify_journal(
    marks: Callable[[], Marks],
    scan: Callable[[int, int], Iterable[Row]],
    upto: int | None,
    *,
    after: int = 0,
    anchor: str = GENESIS,
    on_row: OnRow | None = None,
) -> VerifyReport:
    """Verify a possibly live journal (the CLI verifies while the gateway appends, or compacts).

    The scan stops at the head recorded when it starts: rows appended meanwhile are newer than this
    verification. Rows beyond the recorded head are looked for afterwards, against a fresh reading
    of the marks (an append moves both in one transaction, so only a forger leaves rows beyond it).
    A body that looks removed is re-checked against the compaction mark read after the scan, since
    a concurrent compaction may have passed it: then the verification runs again.

    ``after``/``anchor``: verify only the rows after seq ``after``, whose chain hash the caller
    already trusts as ``anchor`` (startup: the seq of a snapshot whose own hash binds that hash).
    ``scan(after, limit)`` yields the rows ``after < seq <= limit`` in seq order. ``on_row`` is
    called for each row that passed its checks (see ``verify_rows``); after a retry it may see a
    seq again.
    """
    for _attempt in range(3):
        before = marks()
        limit = before.high_water.seq if upto is None else min(upto, before.high_water.seq)
        report = verify_rows(
            scan(after, limit),
            limit=limit,
            high_water=before.high_water,
            compacted_before=before.compacted_before,
            after=after,
            anchor=anchor,
            on_row=on_row,
        )
        later = marks()
        if not report.ok:
            if report.reason == _BODY_REMOVED and later.compacted_before > before.compacted_before:
                continue
            return report
        beyond = later.high_water.seq + 1
        if later.last_seq >= beyond and (upto is None or upto >= beyond):
            return VerifyReport(
                ok=False,
                checked=report.checked,
                first_bad_seq=beyond,
                reason="rows beyond the recorded head were added outside the journal",
            )
        return report
    return report


def rows_before_the_first(seq: int) -> VerifyReport:
    """A row at seq 0 or below: no store writes one (seqs start at 1), so it was added outside."""
    return VerifyReport(
        ok=False,
        checked=0,
        first_bad_seq=seq,
        reason=f"a row at seq {seq}, before the first, was added outside the journal",
    )


def verify_rows(
    rows: Iterable[Row],
    *,
    limit: int,
    high_water: Head,
    compacted_before: int,
    after: int = 0,
    anchor: str = GENESIS,
    on_row: OnRow | None = None,
) -> VerifyReport:
    """Recompute the chain over rows after+1..limit in seq order (the row at ``after`` having the
    hash ``anchor``); stop at the first bad row. ``on_row(seq, type, schema, parsed_payload)`` is
    called for each row once it passed its checks (startup folds the projections from it, so each
    payload is parsed once); a row that fails never reaches it.

    A tail shorter than ``limit`` (which is at most the recorded head) was truncated.
    """

    def bad(seq: int, reason: str) -> VerifyReport:
        return VerifyReport(ok=False, checked=checked, first_bad_seq=seq, reason=reason)

    expected, prev, prev_ts, checked = after + 1, anchor, float("-inf"), 0
    # The hot loop of startup (every row after the snapshot) and of `smgrl journal verify`:
    # chain_hash() inlined, with the ts text formatted once per batch (rows of a batch share their
    # ts) as build_batch does. The contract tests forge rows with chain_hash() and append with
    # build_batch(), so the three cannot drift apart unnoticed.
    sha256, loads = hashlib.sha256, json.loads
    ts_of, ts_text = None, ""
    for seq, ts, stream, type_, schema, payload, stored_prev, stored_hash in rows:
        if seq != expected:
            return bad(expected, f"row {expected} is missing (next row is {seq})")
        if stored_prev != prev:
            return bad(seq, "prev_hash does not link to the previous row")
        if type(payload) is not str:
            return bad(seq, f"payload is stored as {type(payload).__name__}, not text")
        if type(ts) is not float and type(ts) is not int:
            return bad(seq, "ts is not a number")
        try:
            obj = loads(payload)
        except (ValueError, TypeError):
            return bad(seq, "payload is not valid JSON")
        except RecursionError:
            return bad(seq, "payload is nested too deeply to be an event")
        if ts != ts_of or not ts:  # (0.0 == -0.0, but their texts differ)
            ts_of, ts_text = ts, repr(ts)
        try:
            hashed = hashed_payload(type_, payload, obj) if type_ == BODY_EVENT else payload
            header = f"{prev}\n{seq}\n{ts_text}\n{stream}\n{type_}\n{schema}\n".encode()
            recomputed = sha256(header + hashed.encode("utf-8")).hexdigest()
        except (ValueError, TypeError) as exc:
            return bad(seq, f"row cannot be hashed: {exc}")
        if recomputed != stored_hash:
            return bad(seq, "hash mismatch: the row was modified")
        if ts < prev_ts:
            return bad(seq, "timestamp goes backwards")
        if type_ == BODY_EVENT and isinstance(obj, dict):
            problem = body_problem(obj)
            if problem is not None:
                return bad(seq, problem)
            kept = obj.get("body_encoding") in _KEPT_ENCODINGS
            if kept and obj.get("body") is None and seq >= compacted_before:
                return bad(seq, _BODY_REMOVED)
        if on_row is not None:
            on_row(seq, type_, schema, obj)
        prev, prev_ts, expected, checked = stored_hash, ts, expected + 1, checked + 1
    last = expected - 1
    if last < limit:
        return bad(last + 1, f"tail truncated: the journal recorded seq {high_water.seq}, last row is {last}")
    if last == high_water.seq and last > 0 and prev != high_water.hash:
        return bad(last, "last row's hash differs from the recorded head")
    return VerifyReport(ok=True, checked=checked, first_bad_seq=None, reason=None)


def compacted_payloads(rows: Iterable[tuple[int, str]]) -> list[tuple[str, int]]:
    """``(new_payload, seq)`` for the control.started rows whose kept body compaction may drop.

    Rows that do not parse or whose body fails its check are skipped: compaction must not erase
    the evidence verify reports.
    """
    updates = []
    for seq, payload in rows:
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("body") is None or body_problem(obj) is not None:
            continue
        updates.append((_dumps({**obj, "body": None}), seq))
    return updates
