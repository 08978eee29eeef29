"""The engine RPCs of each gRPC wire, over a :class:`~smgrl.upstream.grpc.Channel`.

Four wires: SGLang (``sglang.grpc.scheduler.SglangScheduler``), vLLM upstream and vLLM as PSRL's
fork has it (both ``vllm.grpc.engine.VllmEngine``, different field numbers, no ``GetLoads`` in
the fork), TokenSpeed (``tokenspeed.grpc.scheduler.TokenSpeedScheduler``). Messages come from
``smg-grpc-proto``, PSRL's from ``protos/psrl_vllm_engine_pb2``.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

import attrs
import trio
from smg_grpc_proto.generated import (
    common_pb2,
    sglang_scheduler_pb2,
    tokenspeed_scheduler_pb2,
    vllm_engine_pb2,
)

from smgrl.upstream.grpc.channel import Channel, Stream
from smgrl.upstream.grpc.protos import psrl_vllm_engine_pb2
from smgrl.upstream.grpc.status import GrpcError, StatusCode

ABORT_TIMEOUT_SECS = 1.0
STREAM_DROPPED = "Stream dropped"


@attrs.frozen
class Wire:
    name: str  # sglang | vllm | vllm-psrl | tokenspeed
    service: str
    pb: ModuleType
    has_loads: bool
    abort_by_ids: bool  # vLLM's AbortRequest names a list of ids, without a reason

    def path(self, method: str) -> str:
        return f"/{self.service}/{method}"


WIRES = {
    "sglang": Wire("sglang", "sglang.grpc.scheduler.SglangScheduler", sglang_scheduler_pb2, True, False),
    "vllm": Wire("vllm", "vllm.grpc.engine.VllmEngine", vllm_engine_pb2, True, True),
    "vllm-psrl": Wire("vllm-psrl", "vllm.grpc.engine.VllmEngine", psrl_vllm_engine_pb2, False, True),
    "tokenspeed": Wire(
        "tokenspeed", "tokenspeed.grpc.scheduler.TokenSpeedScheduler", tokenspeed_scheduler_pb2, True, False
    ),
}


class TokenizerMismatch(Exception):
    """The bundle's bytes do not hash to the sha256 its last chunk names."""


class EngineClient:
    """One engine's RPCs on one channel (the channel is the caller's to close)."""

    def __init__(self, channel: Channel, wire: Wire):
        self.channel = channel
        self.wire = wire

    async def _unary(self, method: str, request: Any, response: Any, timeout: float | None) -> Any:
        return await self.channel.unary(self.wire.path(method), request, response, timeout=timeout)

    async def health_check(self, timeout: float | None = None):
        pb = self.wire.pb
        return await self._unary("HealthCheck", pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout)

    async def model_info(self, timeout: float | None = None):
        pb = self.wire.pb
        return await self._unary("GetModelInfo", pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout)

    async def server_info(self, timeout: float | None = None):
        pb = self.wire.pb
        return await self._unary(
            "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout
        )

    async def loads(self, timeout: float | None = None):
        """``GetLoads``; None on a wire without it (PSRL's fork) or an engine answering UNIMPLEMENTED."""
        if not self.wire.has_loads:
            return None
        pb = self.wire.pb
        try:
            return await self._unary("GetLoads", pb.GetLoadsRequest(), pb.GetLoadsResponse, timeout)
        except GrpcError as exc:
            if exc.code == StatusCode.UNIMPLEMENTED:
                return None
            raise

    async def abort(self, request_id: str, reason: str = STREAM_DROPPED, timeout: float | None = None):
        pb = self.wire.pb
        if self.wire.abort_by_ids:
            request = pb.AbortRequest(request_ids=[request_id])
        else:
            request = pb.AbortRequest(request_id=request_id, reason=reason)
        return await self._unary("Abort", request, pb.AbortResponse, timeout)

    async def tokenizer(self, timeout: float | None = None) -> tuple[bytes, str]:
        """The tokenizer bundle (zip bytes) and its sha256, verified (TokenizerMismatch)."""
        chunks: list[bytes] = []
        sha = ""
        async with self.channel.server_stream(
            self.wire.path("GetTokenizer"),
            common_pb2.GetTokenizerRequest(),
            common_pb2.GetTokenizerChunk,
            timeout=timeout,
        ) as stream:
            async for chunk in stream:
                chunks.append(chunk.data)
                sha = chunk.sha256 or sha
        data = b"".join(chunks)
        digest = hashlib.sha256(data).hexdigest()
        if not sha or digest != sha:
            raise TokenizerMismatch(f"tokenizer bundle sha256 {digest} does not match the engine's {sha!r}")
        return data, sha

    async def generate_each(self, request: Any, on_message: Callable[[Any], bool]) -> None:
        """A Generate stream read to its end, each message handed to ``on_message``; when it
        returns True the call ends there. Ending before the stream did (that, an error, a
        cancel) resets the stream and sends Abort, as leaving :meth:`generate` early does; no
        deadline of its own. :meth:`generate` without its two context-manager layers: the
        buffered data plane's call, paid once per request."""
        finished = False
        try:
            stream = await self.channel.open_stream(
                self.wire.path("Generate"), request, self.wire.pb.GenerateResponse
            )
            try:
                while True:
                    msg = await stream.read()
                    if msg is None or on_message(msg):
                        break
                finished = stream.status is not None
            finally:
                stream.close()
        finally:
            if not finished:
                await self._abort_dropped(request)

    @contextlib.asynccontextmanager
    async def generate(self, request: Any, *, timeout: float | None = None) -> AsyncIterator[Stream]:
        """A Generate stream. Leaving the block before the stream ended (the client went away, a
        cancel, an error) resets the stream and also sends the engine's Abort for the request:
        an engine may keep decoding a request whose stream was reset (SMG sends the same Abort,
        reason "Stream dropped"), and only Abort frees its slot."""
        finished = False
        try:
            async with self.channel.server_stream(
                self.wire.path("Generate"), request, self.wire.pb.GenerateResponse, timeout=timeout
            ) as stream:
                yield stream
                finished = stream.status is not None
        finally:
            if not finished:
                await self._abort_dropped(request)

    async def _abort_dropped(self, request: Any) -> None:
        """The engine's Abort for a Generate call left before its stream ended. Shielded and
        bounded: this runs while the caller is being cancelled, and the Abort must still go out,
        but never hold the caller longer than a second."""
        with (
            trio.CancelScope(shield=True),
            trio.move_on_after(ABORT_TIMEOUT_SECS),
            contextlib.suppress(GrpcError),
        ):
            await self.abort(request.request_id, STREAM_DROPPED, timeout=ABORT_TIMEOUT_SECS)


def wire_named(name: str) -> Wire:
    return WIRES[name]


def generate_request(
    wire: Wire,
    request_id: str,
    input_ids: list[int],
    *,
    max_new_tokens: int | None = None,
    stream: bool = True,
    dp_rank: int | None = None,
    temperature: float | None = None,
    stop: tuple[str, ...] = (),
    stop_token_ids: tuple[int, ...] = (),
    ignore_eos: bool = False,
    seed: int | None = None,
) -> Any:
    """A GenerateRequest on ``wire``, the differences between wires in one place: vLLM names the
    budget ``max_tokens`` and the seed ``seed``, SGLang and TokenSpeed ``max_new_tokens`` (and
    TokenSpeed ``sampling_seed``; SGLang's wire carries no seed, so it is not sent there);
    SGLang's proto defaults are not its semantics, so its sampling values are always set; PSRL's DP rank is a plain int (no way to say "no pin" but to
    leave it 0), upstream's is marked by presence."""
    pb = wire.pb
    sp: dict[str, Any] = {
        "stop": list(stop),
        "stop_token_ids": list(stop_token_ids),
        "ignore_eos": ignore_eos,
    }
    vllm = wire.name.startswith("vllm")
    if max_new_tokens is not None:
        sp["max_tokens" if vllm else "max_new_tokens"] = max_new_tokens
    if wire.name == "sglang":
        sp.update(
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0,
            top_k=-1,
            repetition_penalty=1.0,
        )
    elif temperature is not None:
        sp["temperature"] = temperature
    if seed is not None:
        if vllm:
            sp["seed"] = seed
        elif wire.name == "tokenspeed":
            sp["sampling_seed"] = seed
    request = pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=input_ids),
        sampling_params=pb.SamplingParams(**sp),
        stream=stream,
    )
    if dp_rank is not None:
        request.data_parallel_rank = dp_rank
    return request
