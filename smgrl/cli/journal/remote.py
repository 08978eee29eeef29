"""``smgrl journal events --follow --gateway URL``: a running gateway's journal as it commits,
read from ``GET /v1/rl/journal/stream`` (server-sent events; ``smgrl/http/routes/stream.py``) instead of
polling the file, so it works from any host that reaches the gateway.

Bounded: each read waits at most ``READ_TIMEOUT_SECS`` (the stream sends a keepalive every 15 s,
so a silent connection is a dead one) and ``--follow-seconds`` ends it; a stream that ends, lags
(``event: lagged``) or drops is resumed from the last seq shown (``?after=``: nothing lost, nothing
twice), at most ``RECONNECTS`` times in a row without a record in between, ``RETRY_SECS`` apart.
The key goes in an ``Authorization`` header, never in the URL, and is never printed.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable

from smgrl.cli.journal.group import EXIT_BAD_VALUE, EXIT_MISSING, EXIT_NOT_JOURNAL, CliError
from smgrl.core import escape, redact_url

READ_TIMEOUT_SECS = 45.0
RECONNECTS = 5
RETRY_SECS = 1.0
MAX_LINE = 4 * 1024 * 1024  # one SSE line (a record with a 64 KiB body escaped fits easily)
STREAM_PATH = "/v1/rl/journal/stream"


class _Dropped(Exception):
    """The stream ended or failed; resume from the last seq."""


def parse_gateway(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of ``--gateway``; CliError for anything else."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--gateway must be an http(s) URL, not {redact_url(url)!r}", EXIT_BAD_VALUE)
    if parts.username or parts.password:
        raise CliError("--gateway must not hold credentials: pass the key with --api-key", EXIT_BAD_VALUE)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CliError(f"--gateway has a bad port: {redact_url(url)!r}", EXIT_BAD_VALUE) from None
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


def follow_gateway(
    url: str,
    api_key: str | None,
    after: int | None,
    *,
    on_hello: Callable[[int], None],
    on_record: Callable[[dict], bool],
    deadline: float | None,
) -> None:
    """Read the stream until ``on_record`` returns False, the deadline passes or Ctrl-C (the
    caller catches KeyboardInterrupt). ``after`` None: from now on."""
    target = parse_gateway(url)
    last = after
    failures, reason = 0, ""
    hello = False
    while deadline is None or time.monotonic() < deadline:
        try:
            for kind, data in _events(target, api_key, last, deadline):
                if kind == "hello":
                    if not hello:
                        on_hello(int(data.get("last_seq") or 0))
                        hello = True
                    if last is None:
                        last = int(data.get("last_seq") or 0)
                    # Not a record: failures are not reset here (a gateway whose stream breaks
                    # right after every hello would be retried for ever; see the docstring).
                elif kind == "journal":
                    failures = 0
                    seq = int(data["seq"])
                    if last is not None and seq <= last:
                        continue  # already shown before a reconnect
                    last = seq
                    if not on_record(data):
                        return
                elif kind == "lagged":
                    raise _Dropped("the reader fell behind the gateway's buffer")
            return  # the deadline passed while reading
        except _Dropped as exc:
            failures += 1
            reason = str(exc)
        if failures >= RECONNECTS:
            raise CliError(
                f"lost the journal stream of {redact_url(url)} ({failures} tries in a row): {reason}",
                EXIT_MISSING,
            )
        pause = RETRY_SECS if deadline is None else min(RETRY_SECS, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)


def _events(target, api_key, after, deadline):
    """Yield (event, data) from one connection; raise _Dropped when it ends or fails."""
    scheme, host, port, prefix = target
    conn_cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(host, port, timeout=_timeout(deadline))
    query = "" if after is None else f"?after={after}"
    headers = {"accept": "text/event-stream"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    try:
        try:
            conn.request("GET", prefix + STREAM_PATH + query, headers=headers)
            # Kept: http.client drops conn.sock at getresponse() when the answer closes the
            # connection (HTTP/1.0, ``Connection: close``), while the response still reads it.
            sock = conn.sock
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise _Dropped(f"cannot connect: {exc}") from None
        _check_status(resp)
        event, data = "message", []
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                return
            sock.settimeout(_timeout(deadline))
            try:
                raw = resp.readline(MAX_LINE)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return
                raise _Dropped(f"no data (not even a keepalive) for {READ_TIMEOUT_SECS:g}s") from None
            except (OSError, http.client.HTTPException) as exc:
                raise _Dropped(f"the connection failed: {exc}") from None
            if not raw:
                raise _Dropped("the gateway ended the stream")
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line == "":
                if data:
                    try:
                        obj = json.loads("\n".join(data))
                    except ValueError:
                        raise _Dropped("the stream sent an event that is not JSON") from None
                    key = {"journal": "seq", "hello": "last_seq"}.get(event)
                    if not isinstance(obj, dict) or (key is not None and type(obj.get(key)) is not int):
                        raise _Dropped(f"the stream sent a malformed {escape(event[:40])} event")
                    yield event, obj
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            # ``id:`` and ``: keepalive`` comments need nothing: the seq is in the data.
    finally:
        conn.close()


def _timeout(deadline: float | None) -> float:
    if deadline is None:
        return READ_TIMEOUT_SECS
    return max(0.05, min(READ_TIMEOUT_SECS, deadline - time.monotonic()))


def _check_status(resp) -> None:
    if resp.status == 200:
        return
    try:
        body = json.loads(resp.read(64 * 1024) or b"{}")
    except (ValueError, OSError, http.client.HTTPException):
        body = {}
    said = body.get("message") if isinstance(body, dict) else None
    said = f": {escape(str(said)[:500])}" if said else ""  # the server's text, on a terminal
    if resp.status in (401, 403):
        raise CliError(
            f"the gateway refused to stream its journal ({resp.status}){said}; pass a key with --api-key "
            "or SMGRL_API_KEY",
            EXIT_BAD_VALUE,
        )
    if resp.status == 404:
        raise CliError("the gateway has no journal stream (GET /v1/rl/journal/stream: 404)", EXIT_NOT_JOURNAL)
    raise _Dropped(f"the gateway answered {resp.status}{said}")
