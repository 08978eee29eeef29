"""The gateway's listening sockets, bound before the journal is touched so that a port in use
is one line naming it and nothing is written (``StartupError``): the HTTP port (or the socket a
``--workers N`` supervisor handed down) and the metrics port."""

from __future__ import annotations

import socket

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets

from smgrl.core import hostport as core_hostport
from smgrl.core.config import Config
from smgrl.core.errors import StartupError


def hypercorn_config(cfg: Config) -> HyperConfig:
    """The bind and the accept backlog: all that is read of hypercorn's Config (its
    ``create_sockets`` binds the port). The server is smgrl's own (smgrl/http/server); it takes
    the connection bounds and the grace period from ``cfg``."""
    hc = HyperConfig()
    host = f"[{cfg.host}]" if ":" in cfg.host and not cfg.host.startswith("[") else cfg.host
    hc.bind = [f"{host}:{cfg.port}"]
    # Rollout fleets open hundreds of connections at once; hypercorn's default accept backlog
    # (100) made the kernel drop the rest of the SYNs, and each dropped one waited a 1 s, 2 s,
    # 4 s... retransmit (measured: 1,000 concurrent streams took 16 s instead of 1 s). The
    # kernel caps it at net.core.somaxconn.
    hc.backlog = 4096
    return hc


def inherited_http(fd: int) -> Sockets:
    """The listening socket a ``--workers N`` supervisor bound and handed down (``smgrl/cluster/supervisor.py``):
    every worker accepts from the same socket, the kernel hands each connection to one of them."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])


def bind_http(hc: HyperConfig, cfg: Config) -> Sockets:
    """Bind the HTTP port now, before the journal is touched: a port in use is one line naming
    it, and nothing is written. Not listening yet (``run_http`` does, once the state is
    restored): until then a client is refused at once instead of waiting in the backlog."""
    try:
        sockets = hc.create_sockets()
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {hostport((cfg.host, cfg.port))} (--port): {exc.strerror or exc}"
        ) from None
    return sockets


async def bind_metrics(cfg: Config) -> list[trio.SocketListener] | None:
    """The metrics listener's sockets (``--prometheus-port``, 0 picks a free port); None when
    ``prometheus_port`` is None (in-process gateways)."""
    if cfg.prometheus_port is None:
        return None
    host = cfg.prometheus_host or cfg.host
    try:
        return await trio.open_tcp_listeners(cfg.prometheus_port, host=host)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {hostport((host, cfg.prometheus_port))} (--prometheus-port): {exc.strerror or exc}"
        ) from None


def close_sockets(sockets: Sockets) -> None:
    for sock in sockets.insecure_sockets:
        sock.close()


def hostport(sockname) -> str:
    """A socket address (``getsockname()``) as ``host:port``."""
    return core_hostport(sockname[0], sockname[1])
