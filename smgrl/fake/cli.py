"""``smgrl fake-engine``: serve fake engines on many ports from one process.

When every listener is up it prints ONE line of JSON to stdout and flushes it::

    {"ready": true, "kind": "sglang", "urls": ["http://127.0.0.1:31000", ...], "pid": 1234}

SIGINT or SIGTERM stops it cleanly (exit code 0).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import sys
import tempfile
from typing import Any

import click
import trio

from smgrl.core.numbers import parse_uint
from smgrl.fake.fleet import ENGINE_KINDS, build_engines
from smgrl.fake.sync import Gauge


def parse_ports(spec: str) -> list[int]:
    """``31000-31063``, ``31000,31002``, ``0`` (ephemeral) and mixes of those."""
    ports: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        first = parse_uint(lo.strip())
        last = parse_uint(hi.strip()) if sep else first
        if first is None or last is None:
            raise click.BadParameter(f"not a port or range: {part!r}")
        if not (0 <= first <= last <= 65535):
            raise click.BadParameter(f"bad port range: {part!r}")
        ports.extend(range(first, last + 1))
    if not ports:
        raise click.BadParameter("no ports given")
    taken = [p for p in ports if p]
    if len(taken) != len(set(taken)):
        raise click.BadParameter("a port is listed twice")
    return ports


def _loopback(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise click.BadParameter(f"fake engines listen on loopback only, not {host!r}")


async def serve(
    kind: str, ports: list[int], config: dict[str, Any], grpc_wire: str | None = None, tokenizer_path=None
) -> None:
    gauge = Gauge()
    with tempfile.TemporaryDirectory(prefix="smgrl-fake-engine-") as root:
        # Over gRPC the listed ports serve gRPC and each engine's HTTP (control) side an
        # ephemeral port, printed as its control URL.
        engines = build_engines(kind, [0] * len(ports) if grpc_wire else ports, config, root, gauge)
        # Installed before the ready line: a supervisor may signal us the moment it reads it.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            # The root nursery owns every engine; cancelling it on a signal closes them all.
            async with trio.open_nursery() as nursery:
                for engine in engines:
                    try:
                        await nursery.start(engine.serve)
                    except BaseException as exc:
                        bind = _find(exc, OSError)
                        if bind is None:
                            raise
                        where = f"{engine.server.host}:{engine.server.port}"
                        raise CannotListen(f"cannot listen on {where}: {bind.strerror or bind}") from None
                line = {"ready": True, "kind": kind, "urls": [e.url for e in engines], "pid": os.getpid()}
                if grpc_wire:
                    fronts = await _start_fronts(nursery, engines, ports, grpc_wire, config, tokenizer_path)
                    line = {**line, "urls": [f.url for f in fronts], "control_urls": line["urls"],
                            "grpc_wire": grpc_wire}  # fmt: skip
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
                async for _ in signals:
                    break
                nursery.cancel_scope.cancel()


async def _start_fronts(nursery, engines, ports, wire_name, config, tokenizer_path):
    from smgrl.fake.grpc_front import GrpcFront
    from smgrl.upstream import WIRES

    fronts = []
    for engine, port in zip(engines, ports, strict=True):
        try:
            front = GrpcFront(engine, WIRES[wire_name], port, config["host"], tokenizer_path)
        except (OSError, RuntimeError) as exc:
            raise CannotListen(f"cannot listen on {config['host']}:{port} (gRPC): {exc}") from None
        fronts.append(await nursery.start(front.serve))
    return fronts


class CannotListen(Exception):
    """A port is in use (or not ours to bind): one line and exit 1, never a traceback."""


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``exc`` or, through trio's nurseries, in its exception groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


@click.command("fake-engine")
@click.option(
    "--kind",
    type=click.Choice(sorted(ENGINE_KINDS)),
    default="sglang",
    show_default=True,
    help="Which engine to imitate (docs/engines.md).",
)
@click.option(
    "--ports", default="0", show_default=True, help="Ports: 31000-31063, 31000,31001; 0 = ephemeral."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback address to listen on.")
@click.option(
    "--dp-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Data-parallel ranks it reports.",
)
@click.option(
    "--tp-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Tensor-parallel size it reports.",
)
@click.option(
    "--pp-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Pipeline-parallel size it reports.",
)
@click.option("--model-path", default=None, help="Checkpoint dir (default: a fresh fake checkpoint).")
@click.option(
    "--served-model-name", default=None, help="The model name it serves (default: from --model-path)."
)
@click.option(
    "--weight-version", default="default", show_default=True, help="The weight version it starts with."
)
@click.option("--api-key", default=None, help="SGLang: bearer for control routes; TokenSpeed: control key.")
@click.option("--latency-ms", type=float, default=0.0, show_default=True, help="Added to every answer.")
@click.option("--token-latency-ms", type=float, default=0.0, show_default=True, help="Per generated token.")
@click.option(
    "--require-weight-session/--no-require-weight-session",
    default=True,
    show_default=True,
    help="SGLang 0.5.23: distributed and tensor updates need begin/end_weight_update.",
)
@click.option("--real-distributed", is_flag=True, help="Receive tensors over torch gloo (needs torch).")
@click.option("--vllm-server-info", is_flag=True, help="vLLM: serve the dev /server_info instead of 404.")
@click.option(
    "--tokenizer-path",
    default=None,
    help="Model dir (tokenizer.json + tokenizer_config.json): tokenize, generate and decode with it.",
)
@click.option(
    "--grpc", "grpc_flag", is_flag=True, help="Serve gRPC on --ports (HTTP control on other ports)."
)
@click.option("--psrl", is_flag=True, help="With --kind vllm --grpc: PSRL's vLLM wire (its fork's messages).")
def fake_engine(
    kind: str,
    ports: str,
    host: str,
    dp_size: int,
    tp_size: int,
    pp_size: int,
    model_path: str | None,
    served_model_name: str | None,
    weight_version: str,
    api_key: str | None,
    latency_ms: float,
    token_latency_ms: float,
    require_weight_session: bool,
    real_distributed: bool,
    vllm_server_info: bool,
    tokenizer_path: str | None,
    grpc_flag: bool,
    psrl: bool,
) -> None:
    """Serve fake SGLang, vLLM or TokenSpeed engines on many ports from one process."""
    if tokenizer_path is not None:
        from smgrl.fake import model
        from smgrl.tito import TitoError

        try:
            model.use_tokenizer(tokenizer_path)
        except (TitoError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint="--tokenizer-path") from None
    config = {
        "host": _loopback(host),
        "dp_size": dp_size,
        "tp_size": tp_size,
        "pp_size": pp_size,
        "model_path": model_path,
        "served_model_name": served_model_name,
        "weight_version": weight_version,
        "api_key": api_key,
        "latency_ms": latency_ms,
        "token_latency_ms": token_latency_ms,
        "require_weight_session": require_weight_session,
        "real_distributed": real_distributed,
        "vllm_server_info": vllm_server_info,
    }
    if psrl and not (grpc_flag and kind == "vllm"):
        raise click.BadParameter("--psrl needs --kind vllm --grpc", param_hint="--psrl")
    wire = ("vllm-psrl" if psrl else kind) if grpc_flag else None
    try:
        trio.run(serve, kind, parse_ports(ports), config, wire, tokenizer_path)
    except BaseException as exc:
        failed = _find(exc, CannotListen)
        if failed is None:
            raise
        click.echo(f"error: {failed}", err=True)
        sys.exit(1)
