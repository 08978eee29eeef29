"""One TCP (or TLS) connection to an engine: open it, test it while idle, close it.

Closing is synchronous on purpose. It runs in cleanup paths, usually with a ``trio.Cancelled``
or an error already in flight; an ``await stream.aclose()`` there would be a checkpoint, which
in a cancelled scope raises again before or after the fd is closed depending on the stream type
(an ``SSLStream`` even tries to send close_notify). Closing the socket directly is immediate,
cannot be interrupted, and is all HTTP/1.1 needs: every message we reuse a connection after is
self-delimited, so no TLS close_notify is required (which is also why TLS streams are opened
with ``https_compatible=True``: an engine may close without one).
"""

from __future__ import annotations

import os
import select
import ssl
from typing import Final

import trio

from smgrl.upstream.errors import ConnectError

__all__ = ["RECEIVE_SIZE", "STREAM_ERRORS", "Connection", "open_connection"]

# Bytes asked of one recv. Small responses arrive whole; a large body streams in 64 KiB pieces.
RECEIVE_SIZE: Final = 65536
# What a trio stream raises when the connection broke (SSL errors are OSErrors too).
STREAM_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
# A socket's fd read and written directly (``Connection.send``/``receive``); names of their own
# so a test can make them fail like a broken connection does.
_write = os.write
_read = os.read


class Connection:
    """A connection owned by exactly one party at a time: the pool's idle stack or one exchange."""

    __slots__ = ("_fd", "_socket", "idle_since", "stream")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self._socket = socket
        self.idle_since = 0.0
        # Plain TCP: ``send``/``receive`` use the socket's fd directly (see there); None for TLS
        # (``open_connection`` sets it only for a connection that stays plain).
        self._fd: int | None = None

    @property
    def fd(self) -> int | None:
        """The socket's fd for a plain-TCP connection (non-blocking), None for TLS."""
        return self._fd

    async def send(self, data: bytes) -> None:
        """``stream.send_all(data)``, for plain TCP without its schedule point when the kernel
        takes every byte at once (a request almost always fits the socket buffer).

        Measured (docs/benchmarks.md, "rollout (data plane)"): trio's ``send_all`` ends every send with a
        ``cancel_shielded_checkpoint``, a task switch per engine call; the caller's next step
        is a receive that waits anyway, which is its checkpoint. Errors are trio's: a broken
        connection raises ``trio.BrokenResourceError`` (one of ``STREAM_ERRORS``)."""
        fd = self._fd
        if fd is None:
            await self.stream.send_all(data)
            return
        try:
            sent = _write(fd, data)  # the fd is non-blocking (trio made it so)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
        if sent < len(data):
            await self.stream.send_all(memoryview(data)[sent:])

    async def receive(self, size: int) -> bytes:
        """``stream.receive_some(size)``; for plain TCP, one wait for readability and one
        ``read``: trio's first tries a ``recv`` that (right after a request) fails with EAGAIN,
        then waits, reads and passes a schedule point of its own."""
        fd = self._fd
        if fd is None:
            return await self.stream.receive_some(size)
        # Cancellable here (the wait is the checkpoint); the read below never blocks.
        await trio.lowlevel.wait_readable(fd)
        try:
            return _read(fd, size)
        except BlockingIOError:  # woken without data after all: trio's way
            return await self.stream.receive_some(size)
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc

    def close(self) -> None:
        """Close now, without a checkpoint (see the module docstring). Idempotent."""
        self._socket.close()

    def readable_while_idle(self) -> bool:
        """True if the engine sent anything (EOF, a reset, or bytes) while nobody was asking.

        An idle HTTP/1.1 connection must be silent. If it is readable, the engine has closed it
        (FIN or RST: the common case, an idle timeout on the engine's side) or sent something
        unsolicited (e.g. a 408) that we would otherwise read as the answer to our next
        request. Either way it cannot be reused. A zero-timeout poll is one cheap syscall and
        never blocks; ``poll`` rather than ``select`` so fds above 1024 work.
        """
        poller = select.poll()
        poller.register(self._socket.fileno(), select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))


async def open_connection(
    origin: str, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> Connection:
    """Connect (and do the TLS handshake when ``ssl_context`` is given), or raise ``ConnectError``.

    Cancellation-safe: ``trio.open_tcp_stream`` closes its own sockets when cancelled, and a
    handshake interrupted for any reason closes the TCP socket before the exception propagates,
    so nothing leaks whatever point the caller's deadline fires at.
    """
    try:
        tcp = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        raise ConnectError(f"cannot connect to {origin}: {exc}") from exc
    connection = Connection(tcp, tcp.socket)
    if ssl_context is None:
        connection._fd = tcp.socket.fileno()
        return connection
    tls = trio.SSLStream(tcp, ssl_context, server_hostname=host, https_compatible=True)
    try:
        # Handshake now, not lazily on the first send, so a TLS failure is a ConnectError
        # (nothing was sent) rather than a failed request write.
        await tls.do_handshake()
    except (trio.BrokenResourceError, OSError) as exc:
        connection.close()
        raise ConnectError(f"TLS handshake with {origin} failed: {exc}") from exc
    except BaseException:
        # Cancelled (or anything else) mid-handshake: the socket is ours alone; close it.
        connection.close()
        raise
    connection.stream = tls
    return connection
