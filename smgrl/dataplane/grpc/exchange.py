"""One rollout request to a gRPC engine, answered like an HTTP engine's response.

``GrpcEngines.exchange`` is the gRPC twin of ``EnginePool.stream``: the data plane's dispatch
calls one or the other per instance and relays what it yields the same way (stamping,
loopback, sessions, retries and breakers included). The body is translated
(``smgrl.dataplane.grpc.build``), sent as Generate RPCs on the engine's wire, and the stream
rendered back (``smgrl.dataplane.grpc.render``) as the bytes an HTTP engine would have sent.

A call that could not start (nothing listens, the connection broke before an answer) raises
``ConnectError`` (retried, counted by the breaker, as on HTTP); an engine's gRPC status becomes
an HTTP status with a JSON error body. Leaving the block early (the client went away, a stop
string the gateway found, a timeout) resets the stream and sends the engine's Abort
(``EngineClient.generate``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable

import trio

from smgrl.core.ids import new_call_id
from smgrl.core.wire import json_bytes
from smgrl.dataplane.grpc.build import Plan, Untranslatable, encoded, plan
from smgrl.dataplane.grpc.render import GenItem, RenderedAnswer
from smgrl.dataplane.grpc.tokenizers import EngineTokenizers
from smgrl.upstream import WIRES, Channel, ConnectError, EngineClient, GrpcError, ReadError, StatusCode

JSON = b"application/json"
SSE = b"text/event-stream"

# gRPC status -> the HTTP status of the answer (SMG's mapping for the codes an engine sends).
HTTP_STATUS = {
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.OUT_OF_RANGE: 400,
    StatusCode.FAILED_PRECONDITION: 400,
    StatusCode.NOT_FOUND: 404,
    StatusCode.RESOURCE_EXHAUSTED: 503,
    StatusCode.UNAVAILABLE: 503,
    StatusCode.DEADLINE_EXCEEDED: 504,
    StatusCode.UNIMPLEMENTED: 501,
    StatusCode.CANCELLED: 499,
}


class GrpcAnswer:
    """What ``dispatch`` and the relay read of an answer: status, headers, the body whole or in
    chunks (``smgrl.upstream.Response``'s surface)."""

    def __init__(self, status: int, ctype: bytes, body: bytes | None = None, run=None) -> None:
        self.status = status
        self.headers = [(b"content-type", ctype)]
        if body is not None:
            self.headers.append((b"content-length", str(len(body)).encode()))
        self.trailers: list = []
        self._body = body
        self._run = run  # async iterator of body pieces (a streamed answer)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def aread(self) -> bytes:
        if self._body is not None:
            return self._body
        return b"".join([piece async for piece in self.aiter_chunks()])

    async def read_bounded(
        self, limit: int, on_data: Callable[[int], None] | None = None
    ) -> tuple[bytes, bool]:
        data = await self.aread()
        if on_data is not None:
            on_data(len(data))  # the memory budget (it may refuse: the error propagates)
        return (data[:limit], True) if len(data) > limit else (data, False)

    def aiter_chunks(self) -> AsyncIterator[bytes]:
        if self._run is None:
            return _once(self._body or b"")
        run, self._run = self._run, None
        return run


async def _once(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


def error_answer(status: int, code: str, message: str) -> GrpcAnswer:
    body = {"error": {"type": "invalid_request_error" if status < 500 else "server_error",
                      "code": code, "message": message, "param": None}}  # fmt: skip
    return GrpcAnswer(status, JSON, json_bytes(body))


def _status_answer(exc: GrpcError) -> GrpcAnswer:
    status = HTTP_STATUS.get(exc.code, 502)
    return error_answer(status, f"grpc_{exc.code.name.lower()}", exc.message or exc.code.name)


class GrpcEngines:
    """The gateway's gRPC engines: one channel (one HTTP/2 connection) per engine address."""

    def __init__(self) -> None:
        self.channels: dict[tuple[str, int], Channel] = {}
        self._clients: dict[tuple[str, str], EngineClient] = {}
        self.tokenizer = None  # the gateway's ChatTokenizer (--tokenizer-path), when it has one
        # Without one: the tokenizer each engine served (GetTokenizer), by its origin, or None.
        self.engine_tokenizers = EngineTokenizers()

    def client(self, base_url: str, wire: str) -> EngineClient:
        client = self._clients.get((base_url, wire))
        if client is not None:
            return client
        host, port = address(base_url)
        channel = self.channels.get((host, port))
        if channel is None:
            channel = self.channels[(host, port)] = Channel(host, port)
        client = self._clients[(base_url, wire)] = EngineClient(channel, WIRES[wire])
        return client

    async def served_tokenizer(self, instances):
        """The tokenizer the first of ``instances`` that serves one gave (GetTokenizer; fetched
        once per engine, then remembered), or None; HTTP instances are passed over."""
        for instance in instances:
            if instance.wire is None:
                continue
            client = self.client(instance.base_url, instance.wire)
            found = await self.engine_tokenizers.get(client, instance.base_url)
            if found is not None:
                return found
        return None

    async def aclose(self) -> None:
        for channel in list(self.channels.values()):
            await channel.aclose()
        self.channels.clear()
        self._clients.clear()

    def exchange(self, instance, version: str | None, route: str, body: bytes) -> Exchange:
        """``async with engines.exchange(...) as answer``: the answer of ``instance`` (a gRPC
        one) to ``body`` on ``route``; entered once the call started and its first message (or
        its whole answer, buffered) is in."""
        return Exchange(self, instance, version, route, body)

    async def _answer(
        self, ex: Exchange, instance, version: str | None, route: str, body: bytes
    ) -> GrpcAnswer:
        client = self.client(instance.base_url, instance.wire)
        tokenizer = self.tokenizer
        if tokenizer is None:
            tokenizer = await self.engine_tokenizers.get(client, instance.base_url)
        try:
            obj = json.loads(body) if body else None
            the_plan = plan(route, obj, tokenizer)
        except Untranslatable as exc:
            return error_answer(400, exc.code, str(exc))
        except ValueError:
            return error_answer(400, "invalid_request", "the request body is not valid JSON")
        decode = None
        if tokenizer is not None:
            raw, skip = tokenizer.tokenizer, the_plan.sampling.skip_special_tokens

            def decode(ids):  # as the engines decode: special tokens skipped unless asked for
                return raw.decode(ids, skip_special_tokens=skip)

        # Each call its own engine request id (a body's ``rid`` where it names one): Abort names
        # it, so two requests must never share one (a caller's x-request-id may repeat).
        base = new_call_id()
        items = [
            GenItem(the_plan, i, the_plan.rids[i] if i < len(the_plan.rids) and the_plan.rids[i] else
                 (base if len(the_plan.prompts) == 1 else f"{base}-{i}"), version, decode)
            for i in range(len(the_plan.prompts))
        ]  # fmt: skip
        answer = RenderedAnswer(the_plan, items, instance.model, base)
        call = GenerateCalls(client, the_plan, instance.dp_rank)
        if not the_plan.stream:
            try:
                await call.buffered(items)
            except GrpcError as exc:
                if exc.code == StatusCode.UNAVAILABLE:
                    raise ConnectError(f"gRPC engine {client.channel.authority}: {exc}") from None
                return _status_answer(exc)
            return GrpcAnswer(200, JSON, answer.body())
        # A streamed answer: its calls live in an exit stack that the block's end closes (a call
        # left before its end is reset and its Abort sent: EngineClient.generate).
        stack = contextlib.AsyncExitStack()
        try:
            first = await call.open(stack, items[0])
        except GrpcError as exc:
            if exc.code != StatusCode.UNAVAILABLE:
                await stack.aclose()
                return _status_answer(exc)
            failed = ConnectError(f"gRPC engine {client.channel.authority}: {exc}")
            # The calls see the failure leave (as an exception through their blocks), then it
            # is raised alone.
            await stack.__aexit__(ConnectError, failed, None)
            raise failed from None
        except BaseException as exc:
            if not await stack.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            raise AssertionError("unreachable: the calls' blocks never swallow an exception") from None
        ex.stack = stack
        return GrpcAnswer(200, SSE, run=call.events(stack, answer, items, first))


class Exchange:
    """The block of :meth:`GrpcEngines.exchange`. A class rather than an asynccontextmanager:
    that one's generator, context object and two resumptions were paid on every request; a
    streamed answer's calls are in ``stack``, closed when the block ends (with the exception
    that ended it, as the calls' own blocks would see it)."""

    __slots__ = ("_args", "stack")

    def __init__(self, engines: GrpcEngines, instance, version: str | None, route: str, body: bytes) -> None:
        self._args = (engines, instance, version, route, body)
        self.stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> GrpcAnswer:
        engines, instance, version, route, body = self._args
        return await engines._answer(self, instance, version, route, body)

    async def __aexit__(self, kind, exc, tb) -> bool:
        stack, self.stack = self.stack, None
        if stack is None:
            return False
        return await stack.__aexit__(kind, exc, tb)


class GenerateCalls:
    """The Generate RPCs of one request."""

    def __init__(self, client: EngineClient, the_plan: Plan, dp_rank: int | None) -> None:
        self.client = client
        self.plan = the_plan
        self.dp_rank = dp_rank

    def _request(self, item: GenItem):
        return encoded(self.client.wire, self.plan, item.index, item.rid, self.dp_rank)

    async def buffered(self, items: list[GenItem]) -> None:
        async def one(item: GenItem) -> None:
            def on_message(msg) -> bool:
                if msg.WhichOneof("response") == "complete":
                    item.complete(msg.complete, streamed=False)
                    return False
                item.chunk(msg.chunk)
                return item.stop_hit  # True ends the call here: RST_STREAM and Abort

            await self.client.generate_each(self._request(item), on_message)
            if item.finish is None:
                raise GrpcError(StatusCode.INTERNAL, "the engine ended the stream without a Complete frame")

        if len(items) == 1:
            await one(items[0])
            return
        # One task per prompt: they generate side by side, as one batched HTTP request does;
        # the first failure cancels the others (each resets its call and sends Abort).
        async with trio.open_nursery() as nursery:
            for item in items:
                nursery.start_soon(one, item)

    async def open(self, stack: contextlib.AsyncExitStack, item: GenItem):
        stream = await stack.enter_async_context(self.client.generate(self._request(item)))
        return stream, await stream.read()

    async def events(
        self, stack, answer: RenderedAnswer, items: list[GenItem], first
    ) -> AsyncIterator[bytes]:
        """The SSE body: the items one after the other (each its own call), then the tail."""
        stream, msg = first
        for n, item in enumerate(items):
            if n:
                stream, msg = await self.open(stack, item)
            try:
                while msg is not None:
                    if msg.WhichOneof("response") == "complete":
                        new, delta = item.complete(msg.complete, streamed=True)
                        yield answer.event(item, new, delta, True)
                        break
                    new, delta = item.chunk(msg.chunk)
                    if item.stop_hit:  # the gateway found a stop string: leaving sends Abort
                        yield answer.event(item, new, delta, True)
                        break
                    event = answer.event(item, new, delta, False)
                    if event:
                        yield event
                    msg = await stream.read()
                else:
                    raise ReadError("the gRPC engine ended the stream without a Complete frame")
            except GrpcError as exc:
                raise ReadError(f"gRPC engine {self.client.channel.authority}: {exc}") from None
        yield answer.tail()


def address(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)
