"""Session routes, served raw ASGI in front of Quart like the rollout routes (docs/sessions.md).

- ``POST /sessions`` (201 ``{"session_id"}``), ``GET /sessions/{sid}`` (the capture snapshot),
  ``DELETE /sessions/{sid}`` (409 for new turns, in-flight turns drain, then 204),
  ``POST /sessions/{sid}/v1/chat/completions`` (an OpenAI chat endpoint; ``stream`` works).
- SMG's ``POST/GET/DELETE /tito/sessions[/{id}]`` and the ``x-smg-tito-session-id`` header on
  ``/v1/chat/completions``.
- ``GET /control/sessions``, ``POST /control/hang``, ``POST /control/continue``.

``/sessions`` and ``/tito`` take the data plane's keys; ``/control`` the admin control-plane key
when keys are configured.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio

from journal import Expect, JournalConflict
from smgrl.cluster.forwarding import PeerGone, forwarded_to, hops
from smgrl.core.auth import ENGINE, Denied
from smgrl.core.errors import (
    DataPlaneError,
    LoopbackLimitExceeded,
    NoAvailableWorkers,
    NoEligibleWorkers,
    RequestBodyStalled,
    RequestTimeout,
    UpstreamUnreachable,
    VersionFloorUnmet,
)
from smgrl.core.numbers import parse_uint
from smgrl.core.wire import json_bytes
from smgrl.http.bodies import dataplane_body
from smgrl.http.bodies import envelopes as env
from smgrl.http.fronts import session_passthrough as passthrough
from smgrl.http.fronts.asgi import BodyDisconnected, BodyTooLarge, read_body, until_disconnect
from smgrl.http.openapi.apidoc import ANY, STRING, Body, Resp, Route, allow_table, as_json, model, path_param
from smgrl.http.openapi.schemas import (
    DP_ERROR_CODE,
    DP_UNAUTHORIZED,
    METHOD_NOT_ALLOWED,
    RETRY_AFTER,
    ChatCompletionRequest,
    DataPlaneErrorModel,
)
from smgrl.sessions import (
    EngineAnswerInvalid,
    EngineRefused,
    InvalidTurn,
    SessionBudgetExceeded,
    SessionClosing,
    SessionGone,
    SessionJournalUnavailable,
    SessionNotFound,
    SessionsDisabled,
    TemplateRefused,
    TokenizerUnavailable,
    TooManySessions,
    TurnAborted,
    answer,
    encode_json,
    owner_of,
)
from smgrl.upstream import ReadError

log = logging.getLogger("smgrl.sessions")

JSON_CT = b"application/json"
TITO_HEADER = b"x-smg-tito-session-id"
# Several processes: how long a /control route waits for another process's part of the answer.
CONTROL_PEER_TIMEOUT_SECS = 10.0


def _headers(scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in scope["headers"]:
        out[k.decode("latin-1").lower()] = v.decode("latin-1")
    return out


def match(path: str) -> tuple[str, str | None] | None:
    """(route template, session id) of a session path, else None."""
    if path in ("/sessions", "/tito/sessions", "/control/sessions", "/control/hang", "/control/continue"):
        return path, None
    for prefix in ("/sessions/", "/tito/sessions/"):
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            sid, sep, tail = rest.partition("/")
            if not sid:
                return None
            if not sep:
                return prefix + "{sid}", sid
            if prefix == "/sessions/" and tail == "v1/chat/completions":
                return "/sessions/{sid}/v1/chat/completions", sid
            if prefix == "/sessions/" and tail in passthrough.TAILS:
                return f"/sessions/{{sid}}/{tail}", sid
            return None
    return None


class SessionsASGI:
    def __init__(self, api, service) -> None:
        self.api = api  # the DataPlaneASGI: keys, request ids, error envelopes
        self.svc = service

    def handles(self, scope) -> bool:
        path = scope["path"]
        if path.startswith(("/sessions", "/tito/", "/control/")):
            return match(path) is not None
        # Without a session service a TITO header changes nothing: the turn is an ordinary rollout.
        return (
            self.svc is not None
            and path == "/v1/chat/completions"
            and any(k == TITO_HEADER for k, _ in scope["headers"])
        )

    async def __call__(self, scope, receive, send) -> None:
        rid = self.api._request_id(scope)
        path = scope["path"]
        if path == "/v1/chat/completions":
            route, sid = "tito-chat", _headers(scope).get("x-smg-tito-session-id", "").strip()
        else:
            route, sid = match(path)
            allow = ROUTES[route]
            if scope["method"] not in allow.split(","):
                await self.api._not_allowed(scope, send, rid, allow)
                return
        try:
            if route.startswith("/control/"):
                denied = self._control_denied(scope)
            else:
                denied = self.api._denied(scope)
            if denied is not None:
                await self._denied(send, rid, denied)
                return
            if self.svc is None and not (route == "/tito/sessions/{sid}" and scope["method"] == "DELETE"):
                raise SessionsDisabled(
                    "sessions need the model's tokenizer: start the gateway with --tokenizer-path"
                )
            body = await self._body(scope, receive)
            if sid is not None and await self._forwarded(route, sid, scope, receive, send, rid, body):
                return
            if route.startswith("/control/") and await self._passed_on(scope, receive, send, rid, body):
                return
            await self._route(route, sid, scope, receive, send, rid, body)
        except BodyDisconnected:  # the agent left while sending its body
            return
        except DataPlaneError as exc:
            await self.api._error(send, rid, exc)

    async def _forwarded(self, route, sid, scope, receive, send, rid, body) -> bool:
        """Several processes: a session another process holds is served by that process, the
        request forwarded whole and its answer streamed back (smgrl/cluster/forwarding.py). The caller's
        key was checked here and is checked again there. False: it is served here."""
        fwd = self.api.gateway.forwarder
        if fwd is None or self.svc is None or sid in self.svc.sessions:
            return False
        owner = owner_of(sid)
        if owner is None and (route == "tito-chat" or route.startswith("/tito/")) and _valid_sid(sid):
            owner, _ = await fwd.session_owner(sid)  # a client-chosen TITO id: its session.created
        if owner is None or owner == self.svc.owner:
            return False
        peer = await fwd.peer(owner)
        if peer is None:
            return False  # not a process of this group (an earlier lone gateway's): 410 here
        gone = await self._relay(peer, scope, receive, send, rid, body)
        if gone is not None:
            raise SessionGone(
                f"session {sid} belongs to another gateway process, which cannot serve it: {gone}."
                " Sessions live in the memory of their process (docs/scale-out.md); start a new one"
            )
        return True

    async def _passed_on(self, scope, receive, send, rid, body) -> bool:
        """A /control request another host sent for one process of this host (`_others`) that
        landed on another process here (the processes share the advertised port): passed on to
        the process it names, over loopback (its second hop). False: it is meant for this one."""
        fwd = self.api.gateway.forwarder
        meant = forwarded_to(scope["headers"])
        if fwd is None or self.svc is None or meant in (None, self.svc.owner) or hops(scope["headers"]) != 1:
            return False
        peer = await fwd.peer(meant)
        if peer is None:
            return False
        gone = await self._relay(peer, scope, receive, send, rid, body)
        if gone is not None:
            # The sender counts the ids it sent as `missing` (any answer but a 200).
            raise SessionGone(f"the gateway process this request was sent for cannot serve it: {gone}")
        return True

    async def _relay(self, peer, scope, receive, send, rid, body) -> PeerGone | None:
        """Forward the request to ``peer`` and stream its answer back; the PeerGone when nothing
        could be sent (the caller answers it)."""
        headers = scope["headers"]
        if not any(k == b"x-request-id" for k, _ in headers):
            headers = [*headers, (b"x-request-id", rid)]  # one id in both processes' logs

        async def exchange() -> PeerGone | None:
            try:
                await self.api.gateway.forwarder.asgi(
                    peer, {**scope, "headers": headers}, body, send, hops(scope["headers"])
                )
            except PeerGone as exc:  # answered by the caller
                return exc
            except ReadError:
                # The owner broke off mid-answer (the forwarder logged it): returning without the
                # answer's end makes the server close the client's connection, the only way to
                # say "cut off" once a 200 is out. Not a bug here: no "unhandled error".
                pass
            return None

        # The client's disconnect cancels the exchange (None then); the owner sees its connection
        # close and cancels the turn, as for a client of its own.
        return await until_disconnect(scope, receive, exchange)

    async def _create_tito(self, sid: str, scope) -> bool:
        """Create a TITO session with a client-chosen id here. Several processes: only if no
        other process created it since the journal position its absence was read at (its first
        turn sent to two processes at once is one session); False when one did."""
        fwd = self.api.gateway.forwarder
        expect = None
        if fwd is not None:
            owner, position = await fwd.session_owner(sid)
            if sid in self.svc.sessions:
                # Another first turn of this id created it here during that read (the journal
                # read yields): it is this process's, served here. One still creating it is
                # waited for by create(), which then returns that session.
                return True
            if owner is not None and owner != self.svc.owner:
                return False
            expect = Expect(after=position, types=("session.created",), streams=(f"session:{sid}",))
        try:
            await self.svc.create(_headers(scope), api="tito", sid=sid, expect=expect)
        except JournalConflict:
            return False
        return True

    async def _others(self, route, scope, items: list):
        """Several processes: the /control routes cover every process's sessions. ``items`` of
        other processes' sessions are taken out (in place) and sent to their owners' own route;
        ``GET /control/sessions`` asks every live process. Returns what to await for their
        merged answers (an owner that does not answer: its ids are ``missing``)."""
        fwd = self.api.gateway.forwarder
        targets: dict = {}  # peer -> its items
        if fwd is not None and not hops(scope["headers"]):
            if route == "/control/sessions":
                targets = {peer: [] for peer in await fwd.live_peers()}
            else:
                mine = []
                for item in items:
                    sid = item[0]
                    owner = None if sid in self.svc.sessions else owner_of(sid)
                    if owner is None and sid not in self.svc.sessions and _valid_sid(sid):
                        owner, _ = await fwd.session_owner(sid)
                    peer = await fwd.peer(owner) if owner not in (None, self.svc.owner) else None
                    if peer is None:
                        mine.append(item)
                    else:
                        targets.setdefault(peer, []).append(item)
                items[:] = mine
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type",)]
        headers.append((b"content-type", b"application/json"))

        async def gather() -> dict[str, list]:
            merged: dict[str, list] = {}

            async def one(peer, subset) -> None:
                body = None
                if route != "/control/sessions":
                    body = json_bytes([_control_item(sid, pin) for sid, pin in subset])
                answer = None
                # Bounded: a hung process must not hold this route (its ids answer `missing`).
                with trio.move_on_after(CONTROL_PEER_TIMEOUT_SECS):
                    try:
                        status, _, data = await fwd.request(peer, scope["method"], route, headers, body, 0)
                        answer = json.loads(data) if status == 200 else None
                    except (PeerGone, ValueError):
                        pass
                if not isinstance(answer, dict):
                    answer = {"missing": [sid for sid, _ in subset]} if subset else {}
                for key, values in answer.items():
                    if isinstance(values, list):
                        merged.setdefault(key, []).extend(values)

            # Every owner at once: the answer waits for the slowest, each bounded above.
            async with trio.open_nursery() as nursery:
                for peer, subset in targets.items():
                    nursery.start_soon(one, peer, subset)
            return merged

        return gather

    def _control_denied(self, scope) -> Denied | None:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        decision = self.api.gateway.auth.check(header.decode("latin-1") if header else None, ENGINE)
        return decision if isinstance(decision, Denied) else None

    async def _denied(self, send, rid: bytes, denied: Denied) -> None:
        headers = [(b"x-request-id", rid)]
        if denied.www_authenticate:
            headers.append((b"www-authenticate", denied.www_authenticate.encode()))
        if denied.json:
            await self.api._respond(
                send, denied.status, json_bytes(env.api_key_error_body(denied.message)), headers
            )
        else:
            await self.api._respond(
                send, denied.status, denied.message.encode(), headers, b"text/plain; charset=utf-8"
            )

    async def _body(self, scope, receive) -> bytes:
        # The rollout routes' body deadline (smgrl/http/fronts/dataplane.py, _read_body): a stalled
        # body must not hold this task, nor what arrived of it, for the request timeout.
        with trio.move_on_after(self.api.body_timeout):
            return await self._body_now(scope, self.api.stalling(receive))
        raise RequestBodyStalled(
            f"The request body did not arrive within {self.api.body_timeout:g} seconds "
            "(--dataplane-body-timeout-secs)"
        )

    async def _body_now(self, scope, receive) -> bytes:
        try:
            return await read_body(receive, self.api.max_body)
        except BodyTooLarge:
            raise InvalidTurn("the request body is too large") from None

    @staticmethod
    def _obj(body: bytes, *, required: bool = True) -> Any:
        if not body.strip():
            if required:
                raise InvalidTurn("the request body must be a JSON object")
            return None
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # 100,000-deep: not a body either
            raise InvalidTurn("the request body is not valid JSON") from None

    async def _route(self, route, sid, scope, receive, send, rid, body) -> None:
        method = scope["method"]
        api, svc = self.api, self.svc
        ok = [(b"x-request-id", rid)]
        if route in ("/sessions", "/tito/sessions"):
            s = await svc.create(_headers(scope), api="sessions" if route == "/sessions" else "tito")
            await api._respond(send, 201, json_bytes({"session_id": s.id}), ok)
        elif route in ("/sessions/{sid}", "/tito/sessions/{sid}") and method == "GET":
            snap = svc.snapshot(sid)
            extra = []
            if "header_info" in snap:
                info = snap["header_info"]
                extra = [
                    (b"x-base-worker-id", str(info["base_worker_id"]).encode()),
                    (b"x-target-dp-rank", str(info["target_dp_rank"]).encode()),
                ]
            # Millions of ids: encoded in slices between checkpoints, never in one call.
            await api._respond(send, 200, await encode_json(snap), ok + extra)
        elif route in ("/sessions/{sid}", "/tito/sessions/{sid}"):  # DELETE
            try:
                if svc is None:
                    raise SessionNotFound("sessions are disabled")
                await svc.delete(sid, reason="api" if route.startswith("/sessions") else "tito_api")
            except SessionNotFound:
                if route.startswith("/sessions"):
                    raise
                # SMG's DELETE /tito/sessions/{id} is idempotent: always 204.
            await api._respond(send, 204, b"", ok)
        elif route.startswith("/control/"):
            items = [] if route == "/control/sessions" else _control_items(self._obj(body, required=False))
            remote = await self._others(route, scope, items)
            if route == "/control/sessions":
                out = {"sessions": svc.control_list()}
            elif route == "/control/hang":
                out = await svc.hang([sid for sid, _ in items])
            else:
                out = await svc.resume(items)
            for key, values in (await remote()).items():
                out.setdefault(key, []).extend(values)
            await api._respond(send, 200, json_bytes(out), ok)
        elif route in passthrough.TEMPLATES:  # the session's other OpenAI routes
            defaults = svc.default_headers(sid)
            inner = passthrough.scope_for(scope, passthrough.TEMPLATES[route], defaults, body)
            await api(inner, passthrough.replay(body), send)
        else:  # a chat turn: /sessions/{sid}/v1/chat/completions or the TITO header
            await self._turn(route, sid, scope, receive, send, rid, body)

    async def _turn(self, route, sid, scope, receive, send, rid, body) -> None:
        # A body of megabytes is parsed, checked and rendered in a worker process (the loop gets
        # the few fields it uses); others here.
        large = await self.svc.parse_large(body, _turn_body)
        obj, large = large if large is not None else (_turn_body(body), None)
        if route == "tito-chat":
            if not _valid_sid(sid):
                raise InvalidTurn("x-smg-tito-session-id must be 1-128 printable ASCII characters")
            if sid not in self.svc.sessions:
                if hops(scope["headers"]):
                    # Forwarded here as the owner's, but not held here: never a new session.
                    raise SessionGone(f"session {sid} is not held by this gateway process any more")
                _not_created_lazily(sid)
                try:
                    self.svc._lookup(sid)
                except SessionNotFound:
                    # SMG creates a TITO session lazily on its first captured turn.
                    if not await self._create_tito(sid, scope):
                        # Another process created it first: it serves the turn.
                        if not await self._forwarded(route, sid, scope, receive, send, rid, body):
                            raise SessionGone(
                                f"session {sid} was created by another gateway process"
                            ) from None
                        return
        headers = _headers(scope)
        # The client's disconnect cancels the turn (the engine call is cancelled, nothing is
        # captured; None then), as on the rollout routes.
        result = await until_disconnect(
            scope, receive, self.svc.turn, sid, obj, headers, rid.decode("latin-1"), large
        )
        if result is None:
            return  # the client went away
        head = [
            (b"x-request-id", rid),
            (b"x-smg-routed-worker-id", result.worker.url.encode()),
            (b"x-smgrl-worker-id", result.worker.worker_id.encode()),
            (b"x-base-worker-id", result.worker.identity[0].encode()),
            (b"x-target-dp-rank", str(result.worker.identity[1]).encode()),
        ]
        if result.version_tag is not None:  # the pinned version, as rollouts echo it
            head.append((b"x-version-tag", str(result.version_tag).encode()))
        rid_text = rid.decode("latin-1")
        fields = {
            # A generated id already carries SMG's "chatcmpl-" prefix; a caller's own gets it once.
            "rid": rid_text if rid_text.startswith("chatcmpl-") else "chatcmpl-" + rid_text,
            "model": obj.get("model") if isinstance(obj.get("model"), str) else result.model,
            "message": result.message,
            "finish_reason": result.finish_reason,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "version": result.version,
            "logprobs": result.logprobs,
        }
        if obj.get("stream") is True:
            opts = obj.get("stream_options") if isinstance(obj.get("stream_options"), dict) else {}
            events = b"".join(answer.chunks(**fields, include_usage=bool(opts.get("include_usage"))))
            await self.api._respond(
                send, 200, events, head + [(b"cache-control", b"no-cache")], b"text/event-stream"
            )
            return
        await self.api._respond(send, 200, json_bytes(answer.completion(**fields)), head)


def _not_created_lazily(sid: str) -> None:
    """A TITO id shaped like the ids gateway processes issue (``<owner>-<32 hex>``) names the
    process that issued it: held nowhere, it is a session that ended (a restart, a delete), and
    every process answers the same 410, never creating it (the one whose owner part it carries
    would otherwise create it while the others answer 410). Other client-chosen ids are created
    lazily, as SMG does."""
    if owner_of(sid) is not None:
        raise SessionGone(
            f"session {sid} is not held by any gateway process (an id shaped like the ones gateways issue is"
            " never created by its first turn; choose another id, or POST /tito/sessions)"
        )


def _turn_body(body: bytes) -> dict:
    """A turn's body, checked as the OpenAI chat route checks its own (``max_tokens: -5``,
    nesting deeper than serde's limit, a lone surrogate escape...): 400 ``invalid_turn`` with
    the same words."""
    if not body.strip():
        raise InvalidTurn("the request body must be a JSON object")
    try:
        return dataplane_body.parse_turn(body)
    except DataPlaneError as exc:  # the OpenAI route's refusal (InvalidRequest), in this route's code
        raise InvalidTurn(exc.message) from None


def _valid_sid(sid: str) -> bool:
    """A client-chosen TITO id becomes a session id (in events and log lines): printable ASCII only."""
    return 0 < len(sid) <= 128 and all("!" <= ch <= "~" for ch in sid)


def _control_item(sid: str, pin: tuple[str, int] | None) -> dict:
    """One item of a /control body, as PSRL sends it (for another process's own route)."""
    if pin is None:
        return {"session_id": sid}
    return {"session_id": sid, "base_worker_id": pin[0], "target_dp_rank": pin[1]}


def _control_items(obj: Any) -> list[tuple[str, tuple[str, int] | None]]:
    """PSRL's bodies: ``[{"session_id", "base_worker_id"?, "target_dp_rank"?}]``, bare ids, or
    ``{"sessions": [...]}``; anything else is an empty list."""
    if isinstance(obj, dict):
        obj = obj.get("sessions")
    if not isinstance(obj, list):
        return []
    out = []
    for item in obj:
        if isinstance(item, str):
            out.append((item, None))
        elif isinstance(item, dict) and isinstance(item.get("session_id"), str):
            base, rank = item.get("base_worker_id"), item.get("target_dp_rank")
            pin = None
            dp_rank = rank if type(rank) is int and rank >= 0 else parse_uint(str(rank).strip())
            if isinstance(base, str) and base and dp_rank is not None:
                pin = (base, dp_rank)
            out.append((item["session_id"], pin))
    return out


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------


@model(inline=True)
class _SessionId:
    session_id: str


def _error(description: str, *errors: Any) -> Resp:
    return Resp(description, as_json(DataPlaneErrorModel), {**DP_ERROR_CODE, **RETRY_AFTER}, errors=errors)


SID = path_param("sid", "the session id")
_CONTROL_ITEMS = Body(
    ANY,
    required=False,
    description='`[{session_id, base_worker_id?, target_dp_rank?}]`, bare ids, or `{"sessions": [...]}`; '
    "anything else is an empty list",
)
_COMMON = {
    "405": METHOD_NOT_ALLOWED,
    "503": _error("sessions_disabled: the gateway runs without --tokenizer-path.", SessionsDisabled),
    "500": _error(
        "internal_error: a gateway bug (never bad input); the log has the traceback.", "internal_error"
    ),
}
_GONE = {
    "404": _error("session_not_found: this gateway process never issued the id.", SessionNotFound),
    "410": _error("session_gone: the id belonged to an earlier gateway process (a restart).", SessionGone),
}
_SNAPSHOT = Resp(
    "The capture snapshot: `{session_id, max_trim_tokens, trajectories: [{trajectory_id, accumulated_token_ids, "
    "records}], header_info?, version_floor}`.",
    as_json(ANY),
    {
        "x-base-worker-id": {"required": False, "schema": STRING},
        "x-target-dp-rank": {"required": False, "schema": STRING},
    },
)
_CREATED = {
    "201": Resp("Created.", as_json(_SessionId)),
    "400": _error(
        "invalid_turn: an invalid x-version-tag, or a default header longer than a session stores.",
        InvalidTurn,
    ),
    "429": _error("too_many_sessions: --max-sessions are open; retry-after.", TooManySessions),
    "503": _error(
        "sessions_disabled, or journal_unavailable (the journal cannot record the session: nothing was "
        "created; retryable).",
        SessionsDisabled,
        SessionJournalUnavailable,
    ),
}
_TURN = {
    "200": Resp(
        "A chat.completion built by the gateway from the generated ids (`stream: true`: the completed turn as "
        "chat.completion.chunk events, then `[DONE]`).",
        {"application/json": ANY, "text/event-stream": STRING},
    ),
    "400": _error(
        "invalid_turn (the body refused as the OpenAI chat route refuses it, a message field of the wrong "
        "type, bad x-smg-tito-trajectory-id), chat_template_error (the template refused the conversation) or "
        "session_budget_exceeded (the session's captured trajectories reached --session-max-stored-tokens) or "
        "engine_refused (the engine refused the turn as asked, e.g. a completion longer than its context; "
        "its message is relayed).",
        InvalidTurn,
        TemplateRefused,
        SessionBudgetExceeded,
        EngineRefused,
    ),
    **_GONE,
    "409": _error("session_closing: DELETE is draining the session.", SessionClosing),
    "502": _error("engine_answer_invalid or upstream_unreachable.", EngineAnswerInvalid, UpstreamUnreachable),
    "503": _error(
        "sessions_disabled, tokenizer_unavailable (sessions take the tokenizer a gRPC engine serves and none "
        "has served one yet), no_eligible_workers, version_floor_unmet, no_available_workers, turn_aborted (a deliberate abort: the "
        "trainer's abort_request or one sent straight to the engine; send it again; a weight sync's abort is "
        "looped back) or loopback_limit_exceeded (aborted by syncs more than --max-loopbacks times); retryable.",
        SessionsDisabled,
        TokenizerUnavailable,
        NoEligibleWorkers,
        VersionFloorUnmet,
        NoAvailableWorkers,
        TurnAborted,
        LoopbackLimitExceeded,
    ),
    "408": _error(
        "request_body_stalled: no body bytes for --stream-body-stall-timeout-secs, or the body did not "
        "arrive within --dataplane-body-timeout-secs.",
        RequestBodyStalled,
    ),
    "504": _error("request_timeout.", RequestTimeout),
}
_DELETED = {"204": Resp("Deleted (after in-flight turns drained).")}
_CONTROL_BAD = {"400": _error("invalid_turn: the body is not JSON.", InvalidTurn)}


def _route(method: str, path: str, op_id: str, summary: str, responses: dict, **kw: Any) -> Route:
    control = path.startswith("/control/")
    return Route(
        method,
        path,
        op_id,
        "sessions",
        summary,
        {**_COMMON, **({} if control else {"401": DP_UNAUTHORIZED}), **responses},
        security="control" if control else "data",
        role="admin" if control else "",
        params=(SID,) if "{sid}" in path else (),
        head=False,
        **kw,
    )


# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    _route("POST", "/sessions", "postSession", "Open an agent session", _CREATED),
    _route(
        "GET", "/sessions/{sid}", "getSession", "A session's capture snapshot", {"200": _SNAPSHOT, **_GONE}
    ),
    _route("DELETE", "/sessions/{sid}", "deleteSession", "Drain and delete a session", {**_DELETED, **_GONE}),
    _route(
        "POST",
        "/sessions/{sid}/v1/chat/completions",
        "postSessionChat",
        "One agent turn (OpenAI chat), captured token-exact",
        _TURN,
        body=Body(ChatCompletionRequest),
    ),
    _route(
        "GET",
        "/sessions/{sid}/v1/models",
        "getSessionModels",
        "The models, for an agent pointed at the session (as GET /v1/models)",
        {"200": Resp("`{object: list, data: [...]}`.", as_json(ANY)), **_GONE},
    ),
    _route(
        "POST",
        "/sessions/{sid}/v1/completions",
        "postSessionCompletion",
        "A completion with the session's routing headers (as POST /v1/completions; not captured)",
        {"200": Resp("An OpenAI completion.", as_json(ANY)), **_GONE},
        body=Body(ANY),
    ),
    _route("POST", "/tito/sessions", "postTitoSession", "SMG TITO: open a session", _CREATED),
    _route(
        "GET", "/tito/sessions/{sid}", "getTitoSession", "SMG TITO: the snapshot", {"200": _SNAPSHOT, **_GONE}
    ),
    _route(
        "DELETE",
        "/tito/sessions/{sid}",
        "deleteTitoSession",
        "SMG TITO: delete (idempotent)",
        {**_DELETED, "410": _GONE["410"]},
    ),
    _route(
        "GET",
        "/control/sessions",
        "getControlSessions",
        "Sessions for a coordinator (state, instance, tokens)",
        {"200": Resp("`{sessions: [...]}`.", as_json(ANY))},
    ),
    _route(
        "POST",
        "/control/hang",
        "postControlHang",
        "Hang sessions at their next turn boundary (never aborts work in flight)",
        {"200": Resp("`{hung, deferred, missing}`.", as_json(ANY)), **_CONTROL_BAD},
        body=_CONTROL_ITEMS,
    ),
    _route(
        "POST",
        "/control/continue",
        "postControlContinue",
        "Continue sessions, optionally pinning the next turn to an instance",
        {"200": Resp("`{continued, missing}`.", as_json(ANY)), **_CONTROL_BAD},
        body=_CONTROL_ITEMS,
    ),
)
# The routes and methods served here (the `allow` of their 405): the table's.
ROUTES = allow_table(OPENAPI_ROUTES)
