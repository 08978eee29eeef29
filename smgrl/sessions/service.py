"""The session service: owns the in-memory sessions, their bound, turns, capture and journal events.

A turn (``turn``): wait at the hang gate -> prepare the prompt ids (prefix reuse, ``smgrl.tito``;
in a worker thread when the conversation is long, in worker processes when its body is of
megabytes, ``offload``: the event loop keeps serving) -> dispatch
through the data plane (version floor, sticky instance, the engine's token-in route) -> build the
assistant message from the generated ids -> capture it in the session's tree -> journal a
``session.turn`` summary. Everything here runs on the trio loop except the tokenization thread
and the worker processes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from journal import JournalWriteError
from smgrl.core.numbers import parse_uint
from smgrl.dataplane import GENERATE, ROUTING_TEXT_LIMIT, DataPlane, RolloutRequest, Routed, loopback
from smgrl.events import (
    SessionContinued,
    SessionCreated,
    SessionDeleted,
    SessionEnded,
    SessionHung,
    SessionTurn,
)
from smgrl.routing import InvalidVersionPolicy, metadata, parse_floor
from smgrl.sessions import engine as eng
from smgrl.sessions import errors, large_turns, offload, slices, turn_routing
from smgrl.sessions import logprobs as chat_logprobs
from smgrl.sessions.checks import check_messages, check_tools, input_size
from smgrl.sessions.state import DEFAULT_HEADERS, Session, new_owner_id, new_session_id, owner_of, truthy
from smgrl.tito import (
    Boundary,
    CaptureTree,
    ChatTokenizer,
    PrefixMismatch,
    assistant_message,
    captured,
    is_packed,
    parser_for,
    prepare_turn,
    validate,
)

log = logging.getLogger("smgrl.sessions")

# A turn whose rendered input is longer than this (characters of every field the template
# renders: messages, tools, template kwargs) is checked, rendered and tokenized in a worker thread.
THREAD_CHARS = 16_384
DEFAULT_MAX_TOKENS = 2048
# An engine's answers that refuse the request as asked (answered 400 engine_refused, not 502).
ENGINE_REFUSALS = frozenset({400, 422})
# What one session may make the gateway hold (docs/sessions.md, "Bounds"): each default header a
# session stores (and journals in session.created), the token ids of its captured trajectories,
# and how long it may sit idle before it is ended (session.ended, reason ``idle``).
HEADER_VALUE_LIMIT = 512
DEFAULT_MAX_STORED_TOKENS = 2_000_000
DEFAULT_IDLE_TIMEOUT_SECS = 3600.0


def _leg(gen: eng.Generated, table_version: str | None) -> loopback.Leg:
    """One engine answer as a segment of the turn (``loopback.Rollout`` merges them)."""
    version = gen.weight_version if gen.weight_version is not None else table_version
    ids = list(gen.output_ids)
    spans = [(sp["version"], sp["start"], sp["end"]) for sp in gen.spans] or (
        [(version, 0, len(ids))] if ids else []
    )
    return loopback.Leg(
        ids=ids,
        logprobs=gen.logprobs,
        top=None,
        text=None,
        finish=gen.finish_reason,
        version=version,
        spans=spans,
        obj={},
    )


class TurnResult:
    __slots__ = (
        "completion_tokens",
        "finish_reason",
        "logprobs",
        "message",
        "model",
        "prompt_tokens",
        "version",
        "version_tag",
        "worker",
    )

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


class SessionService:
    def __init__(
        self,
        *,
        chat: ChatTokenizer | None,
        dataplane: DataPlane,
        fleet,
        journal,
        max_sessions: int = 4096,
        gc_threshold: int = 0,
        strategy: str = "auto",
        debug: bool = False,
        tool_parser: str = "hermes",
        owner: str | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT_SECS,
        max_stored_tokens: int = DEFAULT_MAX_STORED_TOKENS,
        tokenizer_source: Callable[[], Awaitable[ChatTokenizer | None]] | None = None,
    ) -> None:
        # chat None: taken from ``tokenizer_source`` (the engines' GetTokenizer) by the first turn
        # that finds one (``ready``); every turn before that answers 503 tokenizer_unavailable.
        self.chat: ChatTokenizer | None = None
        self.tokenizer_source = tokenizer_source
        self.parser = parser_for(tool_parser)
        # Attribute assignments, shaped like the other services' constructors: nothing to share.
        self.dataplane = dataplane
        self.fleet = fleet
        self.journal = journal
        self.max_sessions = max_sessions
        self.gc_threshold = gc_threshold
        self.strategy = strategy
        self.debug = debug
        self.owner = owner or new_owner_id()
        self.sessions: dict[str, Session] = {}
        self.creating = 0  # creations waiting for their session.created to commit (count in the bound)
        self.idle_timeout = idle_timeout  # 0: sessions never expire
        self.max_stored_tokens = max_stored_tokens  # 0: no budget
        self._swept = 0.0  # when idle sessions were last looked for
        self._pending: dict[str, trio.Event] = {}  # ids being created (set once their append ended)
        # Tokenization threads: at most two at once (the machine's other work is the event loop).
        self.limiter = trio.CapacityLimiter(2)
        if chat is not None:
            self._adopt(chat)

    def _adopt(self, chat: ChatTokenizer) -> None:
        self.chat = chat
        self.boundary = Boundary.derive(chat)
        # Worker processes for turns of megabytes (``offload``): only for a tokenizer loaded from
        # a directory, which a worker can load again; at most two turns' work at once.
        self.offloader = large_turns.LargeTurns(chat, self.boundary)

    async def ready(self) -> None:
        """The tokenizer every turn needs is there: given at startup, or taken now from the
        engines (the first one found serves every later turn: one model's engines share it)."""
        if self.chat is not None:
            return
        found = None if self.tokenizer_source is None else await self.tokenizer_source()
        if found is None:
            raise errors.TokenizerUnavailable(errors.TOKENIZER_UNAVAILABLE)
        if self.chat is None:  # another turn may have adopted one while this one fetched
            self._adopt(found)

    # -- lifecycle -----------------------------------------------------------------------------

    async def end_previous(self, store) -> int:
        """Journal ``session.ended`` (reason ``restart``) for every session an earlier gateway
        process created and never deleted: they lived in its memory and are gone."""
        open_: dict[str, str] = {}
        for rec in store.read(types=["session.created", "session.deleted", "session.ended"]):
            ev = rec.event
            if isinstance(ev, SessionCreated):
                open_[ev.session_id] = ev.owner
            else:
                open_.pop(getattr(ev, "session_id", None), None)
        for sid, owner in open_.items():
            await self.journal.append(
                f"session:{sid}", SessionEnded(session_id=sid, reason="restart", owner=owner)
            )
        return len(open_)

    def _lookup(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is not None:
            return s
        owner = owner_of(sid)
        if owner is not None and owner != self.owner:
            raise errors.SessionGone(
                f"session {sid} belongs to another gateway process (sessions live in the process that"
                " created them: a restart ends them, and with several processes each serves its own;"
                " docs/scale-out.md); start a new one"
            )
        raise errors.SessionNotFound(f"session {sid} not found")

    async def create(
        self, headers: Mapping[str, str], api: str = "sessions", sid: str | None = None, expect=None
    ) -> Session:
        """``expect`` (several processes, a client-chosen id): appended only if it holds
        (``journal.Expect``); JournalConflict, and no session here, when another process created
        it first. A client-chosen id whose creation is in progress (its first turns sent at once)
        waits for it: one session, held by whichever call created it."""
        while sid is not None and sid in self._pending:
            await self._pending[sid].wait()
        if sid is not None and sid in self.sessions:
            return self.sessions[sid]
        await self._end_idle()
        if len(self.sessions) + self.creating >= self.max_sessions:
            raise errors.TooManySessions(
                f"{self.max_sessions} sessions are open (--max-sessions); retry later"
            )
        defaults = {k: headers[k] for k in DEFAULT_HEADERS if k in headers}
        for name, value in defaults.items():
            if len(value) > HEADER_VALUE_LIMIT:
                raise errors.InvalidTurn(
                    f"{name} is {len(value)} characters long; a session stores at most {HEADER_VALUE_LIMIT}"
                )
        floor = defaults.get("x-version-tag")
        if floor is not None:
            try:
                floor = None if parse_floor(floor) is None else floor.strip()
            except InvalidVersionPolicy as e:
                raise errors.InvalidTurn(str(e)) from None
        s = Session(
            id=sid or new_session_id(self.owner),
            tree=CaptureTree(strategy=self.strategy, gc_threshold=self.gc_threshold),
            api=api,
            headers=defaults,
            sticky=truthy(defaults.get("x-is-sticky")),
            floor=floor,
            created=trio.current_time(),
            last_active=trio.current_time(),
        )
        base, rank = defaults.get("x-base-worker-id"), defaults.get("x-target-dp-rank")
        if base and rank is not None and (dp_rank := parse_uint(rank.strip())) is not None:
            s.instance = (base, dp_rank)
        event = SessionCreated(
            session_id=s.id,
            owner=self.owner,
            api=api,
            sticky=s.sticky,
            version_floor=floor,
            default_headers=defaults,
        )
        await self._journal_created(s, event, expect)
        self.sessions[s.id] = s
        return s

    async def _journal_created(self, s: Session, event: SessionCreated, expect) -> None:
        """Durable before the session is held and answered 201: a crash right after must still
        end it at the next start, and a journal that cannot take it leaves nothing behind (no
        slot of --max-sessions, no id). Its slot is counted meanwhile (``creating``)."""
        self.creating += 1
        done = self._pending[s.id] = trio.Event()
        try:
            if expect is None:
                await self.journal.append(f"session:{s.id}", event)
            else:
                # JournalConflict: another process created it first; it is not held here.
                await self.journal.append_if(expect, [(f"session:{s.id}", event)])
        except JournalWriteError as exc:
            raise errors.SessionJournalUnavailable(
                f"the journal cannot record the new session ({exc}); nothing was created, retry"
            ) from None
        finally:
            self.creating -= 1
            del self._pending[s.id]
            done.set()

    async def _end_idle(self) -> None:
        """End the sessions idle for longer than ``idle_timeout`` (journaled ``session.ended``,
        reason ``idle``): looked for at a session's creation, at most every eighth of the
        timeout (a minute at most), and always when the bound is reached, so an agent that never
        deleted its sessions does not fill the gateway for good. Never a session something holds
        (``Session.idle_for``)."""
        if not self.idle_timeout:
            return
        now = trio.current_time()
        full = len(self.sessions) + self.creating >= self.max_sessions
        if not full and now - self._swept < min(self.idle_timeout / 8, 60.0):
            return
        self._swept = now
        idle = [
            s
            for s in self.sessions.values()
            if (held := s.idle_for(now)) is not None and held > self.idle_timeout
        ]
        for s in idle:
            if self.sessions.get(s.id) is s:
                del self.sessions[s.id]
        if idle:
            log.info("ended %d idle session(s) (no use for %g s)", len(idle), self.idle_timeout)
            await self.journal.append_many(
                [
                    (f"session:{s.id}", SessionEnded(session_id=s.id, reason="idle", owner=self.owner))
                    for s in idle
                ]
            )

    def _check_budget(self, s: Session, prompt_tokens: int, cap: int | None) -> None:
        """Refused before any engine is called when the turn's capture could take the session's
        stored trajectories past ``max_stored_tokens`` (each captured turn stores its whole ids)."""
        if not self.max_stored_tokens:
            return
        wanted = s.tree.stored_tokens + prompt_tokens + (DEFAULT_MAX_TOKENS if cap is None else cap)
        if wanted > self.max_stored_tokens:
            raise errors.SessionBudgetExceeded(
                f"session {s.id} holds {s.tree.stored_tokens} captured token ids; this turn could take it"
                f" past its budget of {self.max_stored_tokens} (--session-max-stored-tokens): read its"
                " trajectories (GET) and delete it, or start a new session"
            )

    def default_headers(self, sid: str) -> dict[str, str]:
        """The session's default routing headers (404/410 as for any session route)."""
        return dict(self._lookup(sid).headers)

    def snapshot(self, sid: str) -> dict:
        s = self._lookup(sid)
        snap = s.tree.snapshot(s.id)
        if s.instance is not None:
            snap["header_info"] = {"base_worker_id": s.instance[0], "target_dp_rank": s.instance[1]}
        snap["version_floor"] = s.floor
        return snap

    async def delete(self, sid: str, reason: str = "api") -> bool:
        """Close, drain in-flight turns, then drop. False when there was nothing to delete."""
        s = self.sessions.get(sid)
        if s is None:
            self._lookup(sid)  # 410 for another process's session, else 404
        if s.closing:
            await s.drained.wait()
            return True
        s.close()
        # Turns in flight finish and are captured (their agent gets its answer); new ones get 409.
        await s.drained.wait()
        if self.sessions.get(sid) is s:
            del self.sessions[sid]
        await self.journal.append(
            f"session:{sid}", SessionDeleted(session_id=sid, turns=s.turns, reason=reason)
        )
        return True

    # -- control -------------------------------------------------------------------------------

    def control_list(self) -> list[dict]:
        return [s.control_view() for s in self.sessions.values()]

    async def hang(self, ids: Sequence[str]) -> dict:
        out: dict[str, list[str]] = {"hung": [], "deferred": [], "missing": []}
        for sid in ids:
            s = self.sessions.get(sid)
            if s is None or s.closing:
                out["missing"].append(sid)
                continue
            result = s.hang()
            out[result].append(sid)
            await self.journal.enqueue(
                f"session:{sid}", SessionHung(session_id=sid, deferred=result == "deferred")
            )
        return out

    async def resume(self, items: Sequence[tuple[str, tuple[str, int] | None]]) -> dict:
        out: dict[str, list[str]] = {"continued": [], "missing": []}
        for sid, pin in items:
            s = self.sessions.get(sid)
            if s is None:
                out["missing"].append(sid)
                continue
            s.resume(pin)
            s.last_active = trio.current_time()
            out["continued"].append(sid)
            event = SessionContinued(
                session_id=sid, pin_worker_id=pin[0] if pin else None, pin_dp_rank=pin[1] if pin else None
            )
            await self.journal.enqueue(f"session:{sid}", event)
        return out

    # -- a turn --------------------------------------------------------------------------------

    async def _gate(self, s: Session) -> tuple[str, int] | None:
        while True:
            if s.closing:
                raise errors.SessionClosing(f"session {s.id} is closing")
            if s.hang_state != "hung":
                return s.begin_turn()
            # Hung at a turn boundary: wait for continue (or delete, which also sets the event).
            await s.continue_event.wait()

    def _trajectory(self, headers: Mapping[str, str]) -> int | None:
        if self.strategy != "manual":
            return None
        raw = headers.get("x-smg-tito-trajectory-id", "0").strip() or "0"
        value = parse_uint(raw)
        if value is None:
            raise errors.InvalidTurn("x-smg-tito-trajectory-id must be a non-negative integer")
        return value

    async def parse_large(self, body: bytes, parse: Callable[[bytes], dict]):
        """(the body fields the loop uses, the turn for ``turn``) of a body of megabytes, parsed
        and rendered in a worker process; None: parsed by the caller (``LargeTurns.parse``)."""
        await self.ready()
        return await self.offloader.parse(body, parse)

    async def _prepare(self, messages, tools, kwargs, s: Session, large: large_turns.LargeTurn | None = None):
        if large is not None:
            return await self.offloader.prepare(large, s)

        def run():
            check_messages(messages)
            check_tools(tools)
            return prepare_turn(
                self.chat, self.boundary, messages, tools=tools, kwargs=kwargs, lookup=s.tree.lookup
            )

        try:
            if input_size(messages, tools, kwargs, limit=THREAD_CHARS) > THREAD_CHARS:
                # Long turns: check + render + tokenize off the event loop (tokenizers releases
                # the GIL); cancellation abandons the thread's result, which is pure.
                return await trio.to_thread.run_sync(run, limiter=self.limiter, abandon_on_cancel=True)
            return run()
        except Exception as e:
            # A template meeting a value it cannot render (checks above cover the known shapes):
            # the conversation's fault, refused in its own words, never a 500.
            refused = offload.refusal(e)
            if refused is None:
                raise
            if refused is e:
                raise
            raise refused from None

    async def turn(
        self,
        sid: str,
        body: dict,
        headers: Mapping[str, str],
        rid: str,
        large: large_turns.LargeTurn | None = None,
    ) -> TurnResult:
        """``large``: the turn's messages stayed in a worker process (``parse_large``); ``body``
        holds the fields the loop uses."""
        s = self._lookup(sid)
        await self.ready()
        if large is None:
            messages, tools, kwargs = offload.turn_inputs(body)
        else:
            messages, tools, kwargs = None, None, {}
        requested = self._trajectory(headers)
        model = self.dataplane.resolve_model(
            body.get("model") if isinstance(body.get("model"), str) else None
        )
        pin = await self._gate(s)
        s.last_active = trio.current_time()
        try:
            return await self._turn(
                s,
                body,
                messages,
                tools,
                kwargs or None,
                requested,
                model,
                pin,
                rid,
                turn_headers=headers,
                large=large,
            )
        finally:
            s.last_active = trio.current_time()
            if s.end_turn():
                await self.journal.enqueue(f"session:{s.id}", SessionHung(session_id=s.id, deferred=True))

    async def _turn(
        self, s, body, messages, tools, kwargs, requested, model, pin, rid, turn_headers=None, large=None
    ) -> TurnResult:
        t0 = trio.current_time()
        plan = await self._prepare(messages, tools, kwargs, s, large)
        self._check_budget(s, len(plan.prompt_ids), eng.max_tokens(body))
        t1 = trio.current_time()
        tid = s.tree.reserve(plan.parent_hash, requested)
        try:
            gen, entry, t2, routed, segments = await self._generate(
                s, body, plan.prompt_ids, model, pin, rid, turn_headers
            )
        except BaseException:
            s.tree.release(tid)
            raise
        if gen.finish_reason == "abort":
            s.tree.release(tid)
            raise errors.TurnAborted("the engine aborted the turn (a weight sync); send it again")
        assistant = assistant_message(self.chat, self.parser, gen.output_ids)
        report: list = []
        if self.debug and plan.hit:
            if large is None:
                full = self.chat.encode(plan.full_text)
            else:
                full = slices.ids_array(await self.offloader.run(offload.encode_text, plan.full_text))
            report = validate(self.chat, self.boundary, plan.prompt_ids, full)
        worker = self.fleet.registry.get(entry.instance.worker_id)
        closed = None
        if large is not None:
            # The captured node's hash and render: the conversation is the worker's to read.
            closed = await self.offloader.run(
                offload.close_in_worker, large.parse, large.body, plan.context, assistant
            )
        cap = captured(
            self.chat,
            plan,
            messages,
            assistant,
            tools=tools,
            kwargs=kwargs,
            output_ids=gen.output_ids,
            output_logprobs=gen.logprobs,
            finish_reason=gen.finish_reason,
            weight_version=gen.weight_version if gen.weight_version is not None else entry.version,
            weight_versions=gen.spans,
            engine=entry.instance.url,
            mismatch_report=report,
            closed=closed,
        )
        if segments:
            # A turn looped back across weight syncs: each segment's engine, version and span.
            cap.record["segments"] = [dict(seg) for seg in segments]
        captured_ok = True
        extends = await large_turns.extends(s.tree, cap.parent, cap.token_ids)
        try:
            s.tree.commit(tid, cap.hash, cap.parent, cap.token_ids, cap.record, cap.render_text, extends)
        except PrefixMismatch:
            # Never spliced: the turn starts a new branch (a root) of its own.
            log.warning("session %s: turn does not extend its prefix; stored as a new branch", s.id)
            s.tree.commit(tid, cap.hash, None, cap.token_ids, cap.record, cap.render_text)
        s.turns += 1
        s.total_tokens = max(s.total_tokens, len(cap.token_ids))
        s.worker_id = entry.instance.worker_id
        s.instance = entry.instance.identity
        version = cap.record.get("weight_version")
        if s.floor is None and routed.pinned is not None:
            # The floor is the version the first turn's first selection pinned (the routing
            # table's version of its engine: what the eligibility filter compares); an
            # unversioned fleet pins nothing.
            try:
                if parse_floor(routed.pinned) is not None:
                    s.floor = routed.pinned
            except InvalidVersionPolicy:
                pass
        event = SessionTurn(
            session_id=s.id,
            turn=s.turns,
            trajectory_id=tid,
            prompt_tokens=len(plan.prompt_ids),
            output_tokens=len(gen.output_ids),
            reused_tokens=len(s.tree.entries[plan.parent_hash].token_ids)
            if plan.hit and plan.parent_hash in s.tree.entries
            else 0,
            prefix=plan.reason,
            captured=captured_ok,
            finish_reason=gen.finish_reason,
            weight_version=version,
            weight_versions=tuple(gen.spans),
            worker_id=entry.instance.worker_id,
            engine_url=worker.url if worker is not None else entry.instance.url,
            prepare_ms=round((t1 - t0) * 1000, 3),
            engine_ms=round((t2 - t1) * 1000, 3),
            request_id=rid,
        )
        await self.journal.enqueue(f"session:{s.id}", event)
        return TurnResult(
            message=assistant,
            finish_reason=gen.finish_reason,
            prompt_tokens=len(plan.prompt_ids),
            completion_tokens=len(gen.output_ids),
            version=version,
            # The echoed ``x-version-tag``: the version the turn's selection pinned (its floor,
            # else its first instance's version), as for rollouts; the served version without one.
            version_tag=routed.pinned if routed.pinned is not None else version,
            logprobs=chat_logprobs.content(self.chat, gen.output_ids, gen.logprobs),
            model=model,
            worker=entry.instance,
        )

    def _routed(self, s: Session, pin: tuple[str, int] | None, rid: str, turn_headers=None) -> Routed:
        """The turn's routing, as a rollout's (staged selection): the session's defaults with
        the turn's own routing headers over them, its version floor (never below the one the
        first turn pinned), and the instance hint when honoured (``turn_routing``)."""
        headers = turn_routing.merged_headers(s.headers, turn_headers or {})
        try:
            meta, psrl = turn_routing.turn_meta(
                headers,
                session_floor=s.floor,
                session_sticky=s.sticky,
                last_instance=s.instance,
                pin=pin,
                rid=rid,
            )
        except (metadata.InvalidRoutingMetadata, InvalidVersionPolicy) as e:
            raise errors.InvalidTurn(f"the turn's routing headers: {e}") from None
        return Routed(meta, session=True, psrl=psrl)

    async def _generate(self, s: Session, body, prompt_ids, model, pin, rid, turn_headers=None):
        """One token-in generation through the data plane: the staged selection (``_routed``),
        the engine's dialect (``adapt``), and the partial-rollout loopback: a leg that a weight
        sync through this gateway aborted continues on the same instance (or any at the turn's
        version floor) from the original prompt plus every id so far, its cap reduced, so the
        turn is captured whole with the version span of every segment."""
        routed = self._routed(s, pin, rid, turn_headers)
        registry = self.fleet.registry
        max_loopbacks = self.dataplane.cfg.dataplane.max_loopbacks
        cap = eng.max_tokens(body)
        rollout = loopback.Rollout(
            obj={},
            # A large turn's array('i') stays one (smgrl/tito/ids.py): the rollout only reads it.
            prompt=prompt_ids if is_packed(prompt_ids) else list(prompt_ids),
            cap=DEFAULT_MAX_TOKENS if cap is None else cap,
            max_loopbacks=max_loopbacks,
        )
        req = RolloutRequest(
            route=GENERATE, model=model, stream=False, prefix=tuple(prompt_ids[:ROUTING_TEXT_LIMIT])
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"x-request-id", rid.encode("latin-1", "replace")),
        ]
        kinds: dict[str, str] = {}
        # A long prompt's JSON, encoded here in slices (one json.dumps of a million ids holds the
        # loop for a second); each leg's body splices it.
        encoded = await slices.encode_ids(rollout.prompt) if len(rollout.prompt) > slices.SLICE else None

        def adapt(entry):
            worker = registry.get(entry.instance.worker_id)
            # A gRPC engine answers in SGLang's /generate shape whatever its kind (the data
            # plane renders its Generate stream so): the ids sent are the ids built here.
            runtime = "sglang" if entry.instance.wire is not None else (worker.engine if worker else "")
            kind = kinds["kind"] = eng.engine_kind(runtime)
            if encoded is not None:
                return eng.request_encoded(kind, encoded, rollout.ids, body, rollout.remaining())
            return eng.request(kind, [*rollout.prompt, *rollout.ids], body, rollout.remaining())

        outcome = "cancelled"
        try:
            while True:
                async with self.dataplane.dispatch(
                    req,
                    b"",
                    headers,
                    model=model,
                    buffered=True,
                    routing_key=s.id,
                    routed=routed,
                    adapt=adapt,
                ) as dispatched:
                    status = dispatched.response.status
                    data = dispatched.body or b""
                    entry = dispatched.entry
                    seq = dispatched.seq
                if not 200 <= status < 300:
                    outcome = "failed"
                    said = f"the engine answered {status}: {data[:200].decode('utf-8', 'replace')}"
                    # 400 and 422 are the engine refusing what the turn asked for (SGLang and vLLM
                    # refuse a completion longer than the context so): the caller's to change, not
                    # a fault of the engine or the gateway.
                    if status in ENGINE_REFUSALS:
                        raise errors.EngineRefused(said)
                    raise errors.EngineAnswerInvalid(said)
                try:
                    gen = eng.parse(kinds["kind"], data)
                except eng.EngineAnswerError as e:
                    outcome = "failed"
                    raise errors.EngineAnswerInvalid(str(e)) from None
                instance = entry.instance
                causes = (
                    loopback.loop_causes(self.dataplane, routed, instance, seq)
                    if gen.finish_reason == "abort"
                    else None
                )
                ops = causes or []
                leg = _leg(gen, entry.version)
                rollout.add(leg, instance, ops[0] if ops else None)
                if causes is None:  # done, or a deliberate abort (answered 503 turn_aborted by the caller)
                    outcome = "aborted" if gen.finish_reason == "abort" else "completed"
                    self.dataplane.count_tokens(instance.worker_id, len(leg.ids))
                    break
                if rollout.remaining() == 0:
                    outcome = "completed"
                    self.dataplane.count_tokens(instance.worker_id, len(leg.ids))
                    leg.finish = "length"
                    break
                if rollout.loopbacks >= max_loopbacks:
                    outcome = "limit_exceeded"
                    raise rollout.limit_exceeded()
                # Back to the instance that aborted (eligible again once its sync completes),
                # or any at the pinned floor: never older weights (loopback.prepare).
                loopback.prepare(self.dataplane, routed, rollout, instance, leg, ops)
        finally:
            if rollout.loopbacks or outcome == "limit_exceeded":
                await loopback.record(self.journal, rollout, routed, req, model, outcome)
            await self.dataplane.finish(routed)
        t2 = trio.current_time()
        spans = tuple({"version": v, "start": a, "end": b} for v, a, b in rollout.spans)
        merged = eng.Generated(
            output_ids=list(rollout.ids),
            logprobs=rollout.logprobs,
            finish_reason=leg.finish or gen.finish_reason,
            weight_version=leg.version,
            spans=spans if len(spans) > 1 else (),
        )
        segments = tuple(rollout.segments) if rollout.loopbacks else ()
        return merged, entry, t2, routed, segments
