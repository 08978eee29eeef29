"""Discovery of a gRPC worker over its own wire: HealthCheck, GetModelInfo, GetServerInfo
(optional), GetLoads (where the wire has it) and the tokenizer bundle.

Which wire a worker speaks:

- a ``grpc_wire`` label (``sglang``, ``vllm``, ``vllm-psrl``, ``tokenspeed``) names it;
- else ``runtime_type`` ``sglang`` / ``tokenspeed`` name theirs, and ``vllm`` is told apart by
  ``GetLoads``: PSRL's fork has no such RPC (UNIMPLEMENTED), upstream vLLM answers it. That is
  how PSRL's registration (``runtime_type: vllm``, no wire label) selects PSRL's wire as it is.
- with no runtime, the services are tried in turn (SGLang, TokenSpeed, vLLM).

The chosen wire is kept as the ``grpc_wire`` label. The model id is ``served_model_name`` (else
``model_path``); ``weight_version`` comes from GetModelInfo where the wire carries it (SGLang,
TokenSpeed; vLLM's messages have none). The tokenizer bundle is fetched once per model with
GetTokenizer, its sha256 verified, and kept (``TokenizerCache``); the tokenizer and chat template
it holds serve the data plane's gRPC exchanges with that engine (text prompts, the OpenAI routes,
detokenizing). ``--tokenizer-path`` skips it: that tokenizer serves every engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio
from google.protobuf.json_format import MessageToDict

from smgrl.core import Discovery, grpc_labels, strip_rank
from smgrl.tito import ChatTokenizer, TitoError
from smgrl.upstream import (
    WIRES,
    Channel,
    EngineClient,
    GrpcError,
    StatusCode,
    TokenizerMismatch,
    Wire,
    address_of,
)

WIRE_LABEL = "grpc_wire"
_RUNTIME_OF = {"sglang": "sglang", "vllm": "vllm", "vllm-psrl": "vllm", "tokenspeed": "tokenspeed"}


class GrpcProbeFailed(Exception):
    """Not (yet) answering over gRPC: ``unreachable`` when no connection could be made."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


@attrs.define
class TokenizerCache:
    """Tokenizer bundles by model id: fetched once, verified, kept for the gateway's life; and
    the tokenizer each bundle makes, by engine origin, for the data plane (``chat_for``)."""

    bundles: dict[str, tuple[bytes, str]] = attrs.Factory(dict)
    fixed_path: str | None = None  # --tokenizer-path: no bundle is fetched
    # bundle sha256 -> its ChatTokenizer (None: the bundle makes none, e.g. no tokenizer.json)
    chats: dict[str, Any] = attrs.Factory(dict)
    engines: dict[str, str] = attrs.Factory(dict)  # engine origin (grpc://host:port) -> bundle sha256

    def chat_for(self, base_url: str):
        """The tokenizer and chat template the engine at ``base_url`` served, or None."""
        sha = self.engines.get(base_url)
        return None if sha is None else self.chats.get(sha)


def _address(url: str) -> tuple[str, int]:
    try:
        return address_of(url)
    except ValueError as exc:
        raise GrpcProbeFailed(str(exc)) from None


async def probe_grpc(
    url: str,
    labels: Mapping[str, str],
    runtime: str | None,
    timeout: float,
    tokenizers: TokenizerCache | None = None,
) -> Discovery:
    host, port = _address(url)
    channel = Channel(host, port, connect_timeout_secs=timeout)
    try:
        wire = await _choose_wire(channel, labels, runtime, timeout)
        client = EngineClient(channel, wire)
        health = await client.health_check(timeout=timeout)
        if not health.healthy:
            raise GrpcProbeFailed(f"HealthCheck: not healthy ({health.message})")
        model = MessageToDict(await client.model_info(timeout=timeout), preserving_proto_field_name=True)
        server = await _optional(client.server_info(timeout=timeout))
        loads = await _optional(client.loads(timeout=timeout))
        found = _discovery(wire, model, server, loads)
        if tokenizers is not None and tokenizers.fixed_path is None and found.model_id:
            await _fetch_tokenizer(client, found.model_id, tokenizers, timeout)
            await _build_tokenizer(url, found.model_id, tokenizers)
        return found
    except GrpcError as exc:
        raise GrpcProbeFailed(f"gRPC {exc}", unreachable=exc.code == StatusCode.UNAVAILABLE) from None
    except TokenizerMismatch as exc:
        raise GrpcProbeFailed(str(exc)) from None
    finally:
        await channel.aclose()


async def _optional(call) -> Any:
    try:
        return await call
    except GrpcError as exc:
        if exc.code == StatusCode.UNIMPLEMENTED:
            return None
        raise


async def _choose_wire(
    channel: Channel, labels: Mapping[str, str], runtime: str | None, timeout: float
) -> Wire:
    named = labels.get(WIRE_LABEL)
    if named in WIRES:
        return WIRES[named]
    if runtime in ("sglang", "tokenspeed"):
        return WIRES[runtime]
    if runtime == "vllm":
        return await _vllm_variant(channel, timeout)
    for name in ("sglang", "tokenspeed"):
        try:
            await EngineClient(channel, WIRES[name]).health_check(timeout=timeout)
            return WIRES[name]
        except GrpcError as exc:
            if exc.code != StatusCode.UNIMPLEMENTED:
                raise
    return await _vllm_variant(channel, timeout)


async def _vllm_variant(channel: Channel, timeout: float) -> Wire:
    # PSRL's fork has no GetLoads: an UNIMPLEMENTED here is its wire, an answer upstream's.
    loads = await EngineClient(channel, WIRES["vllm"]).loads(timeout=timeout)
    return WIRES["vllm"] if loads is not None else WIRES["vllm-psrl"]


def _discovery(wire: Wire, model: dict, server: Any, loads: Any) -> Discovery:
    info: dict[str, Any] = {}
    if server is not None:
        info = MessageToDict(server, preserving_proto_field_name=True)
        # A protobuf Struct (SGLang's and TokenSpeed's server_args) holds every number as a
        # double: dp_size 2 arrives as 2.0, which is no size.
        args = info.get("server_args")
        if isinstance(args, dict):
            info["server_args"] = {k: _integral(v) for k, v in args.items()}
    for key in ("sglang_version", "tokenspeed_version"):
        if key in info:
            info.setdefault("version", info[key])
    if loads is not None and loads.version:
        info.setdefault("version", loads.version)
    for key in ("model_path", "served_model_name", "tokenizer_path", "weight_version", "model_type",
                "architectures", "max_context_length"):  # fmt: skip
        if model.get(key) not in (None, "", []):
            info.setdefault(key, model[key])
    if "max_context_length" in info:
        info.setdefault("context_length", info["max_context_length"])
    found = grpc_labels(info, _RUNTIME_OF[wire.name])
    labels = {**found.labels, WIRE_LABEL: wire.name}
    for key in ("model_type", "architectures"):
        if key in info and key not in labels:
            value = info[key]
            labels[key] = value if isinstance(value, str) else ",".join(map(str, value))
    return attrs.evolve(found, labels=labels)


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


async def _fetch_tokenizer(
    client: EngineClient, model_id: str, cache: TokenizerCache, timeout: float
) -> None:
    if model_id in cache.bundles:
        return
    try:
        cache.bundles[model_id] = await client.tokenizer(timeout=max(timeout, 30.0))
    except GrpcError as exc:
        if exc.code not in (StatusCode.UNIMPLEMENTED, StatusCode.FAILED_PRECONDITION):
            raise


async def _build_tokenizer(url: str, model_id: str, cache: TokenizerCache) -> None:
    """The data plane's tokenizer for the engine at ``url``, from its model's bundle: built once
    per bundle, in a worker thread (parsing a real model's tokenizer.json takes longer than an
    event-loop turn may). A bundle that makes no tokenizer (the engine's own vocabulary, or
    no chat template) leaves the engine without one: its text and chat requests then answer
    ``tokenizer_required``, as with no bundle at all."""
    bundle = cache.bundles.get(model_id)
    if bundle is None:
        return
    data, sha = bundle
    if sha not in cache.chats:
        try:
            cache.chats[sha] = await trio.to_thread.run_sync(ChatTokenizer.from_bundle, data, model_id)
        except TitoError:
            cache.chats[sha] = None
    cache.engines[strip_rank(url)] = sha


async def discover_grpc(
    pools, worker, api_key: str | None, timeout: float, tokenizers: TokenizerCache
) -> Discovery:
    """A gRPC worker's discovery: over gRPC. When nothing listens at its URL, from its control
    app (``rl.control_url``) or, without one, as a worker with no known model, as before the
    gateway spoke gRPC (a registration of a data URL that is not up keeps working)."""
    from smgrl.registry.probe import ProbeFailed, probe_control_app

    try:
        found = await probe_grpc(worker.url, worker.labels, worker.runtime, timeout, tokenizers)
    except GrpcProbeFailed as exc:
        if not exc.unreachable:
            raise ProbeFailed(str(exc)) from None
    else:
        return await _vllm_weight_version(pools, worker, found, api_key, timeout)
    return await probe_control_app(
        pools, worker.url, worker.labels, worker.runtime, api_key, timeout, worker.connection_mode
    )


async def _vllm_weight_version(pools, worker, found: Discovery, api_key, timeout: float) -> Discovery:
    """vLLM's gRPC messages carry no weight version; its dev control routes do
    (``GET /weight_info``): read once from the control app when the registration names one.
    Best effort: no control app, or one that does not answer, leaves the row without it."""
    from smgrl.core.control_url import control_url_for
    from smgrl.registry.probe import ProbeFailed, _get_json

    if found.runtime != "vllm" or "weight_version" in found.labels:
        return found
    control = control_url_for(worker.connection_mode, worker.url, worker.url, worker.labels)
    if control is None:
        return found
    try:
        info = await _get_json(pools, control, ["/weight_info"], api_key, timeout)
    except ProbeFailed:
        return found
    version = info.get("weight_version") if info else None
    if not isinstance(version, str):
        return found
    return attrs.evolve(found, labels={**found.labels, "weight_version": version})


def polls_loads(worker) -> bool:
    """A discovered gRPC worker whose wire has GetLoads (not PSRL's fork)."""
    wire = WIRES.get(worker.labels.get(WIRE_LABEL, ""))
    return worker.connection_mode == "grpc" and wire is not None and wire.has_loads


async def read_loads(worker, timeout: float) -> bytes | None:
    """One ``GetLoads`` answer as the JSON ``/v1/loads`` body it mirrors (the load monitor parses
    both alike); None when the engine did not answer. A connection per read: a tick is seconds
    apart, and a removed worker then leaves nothing open."""
    import json

    try:
        host, port = address_of(worker.url)
    except ValueError:
        return None
    channel = Channel(host, port, connect_timeout_secs=timeout)
    try:
        answer = await EngineClient(channel, WIRES[worker.labels[WIRE_LABEL]]).loads(timeout=timeout)
    except GrpcError:
        return None
    finally:
        await channel.aclose()
    if answer is None:
        return None
    doc = MessageToDict(answer, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return json.dumps(doc).encode()
