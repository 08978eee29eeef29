#!/usr/bin/env python3
"""A minimal fake SGLang engine for the benchmarks: standard library only, cheap per call.

Not smgrl's fake engine (``smgrl fake-engine``): that one models an engine's state, scheduler and
knobs, and its per-call cost is part of every fan-out it serves. This one answers from constant
bytes, so a benchmark's engine side costs as little as a Python server can: one process, one
thread, a ``selectors`` loop over non-blocking sockets, many ports, HTTP/1.1 keep-alive,
``content-length`` bodies only.

    python benchmarks/min_engine.py --ports 31000-31063

Routes (GET or POST, any body):

* ``/health``, ``/health_generate``: 200, empty body;
* ``/v1/models``, ``/server_info``, ``/get_server_info``, ``/model_info``, ``/get_model_info``:
  what registration reads (one model, tp/dp/pp 1);
* ``/flush_cache``: 200 ``text/plain`` (SGLang's answer);
* ``/generate``: a small SGLang answer;
* anything else: 200 ``{}``.

Loopback only; it stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys

MODEL = "fake-org/min-model"


def _answer(status: bytes, ctype: bytes | None, body: bytes) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n"
    if ctype is not None:
        head += b"content-type: " + ctype + b"\r\n"
    return head + b"\r\n" + body


def _json(obj) -> bytes:
    return _answer(b"200 OK", b"application/json", json.dumps(obj, separators=(",", ":")).encode())


def answers(port: int) -> dict[bytes, bytes]:
    info = {
        "model_path": MODEL,
        "tokenizer_path": MODEL,
        "served_model_name": MODEL,
        "port": port,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "version": "0.5.0",
        "weight_version": "default",
        "is_embedding": False,
    }
    models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sglang"}]}
    model_info = {
        "model_path": MODEL,
        "tokenizer_path": MODEL,
        "is_generation": True,
        "weight_version": "default",
    }
    generate = {
        "text": "ok",
        "meta_info": {
            "id": "r",
            "finish_reason": {"type": "stop"},
            "prompt_tokens": 4,
            "completion_tokens": 1,
        },
    }
    empty = _answer(b"200 OK", None, b"")
    return {
        b"/health": empty,
        b"/health_generate": empty,
        b"/v1/models": _json(models),
        b"/server_info": _json(info),
        b"/get_server_info": _json(info),
        b"/model_info": _json(model_info),
        b"/get_model_info": _json(model_info),
        b"/flush_cache": _answer(b"200 OK", b"text/plain; charset=utf-8", b"Cache flushed.\n"),
        b"/generate": _json(generate),
        b"": _json({}),
    }


class Conn:
    __slots__ = ("answers", "buf", "sock")

    def __init__(self, sock: socket.socket, table: dict[bytes, bytes]) -> None:
        self.sock = sock
        self.buf = b""
        self.answers = table


def serve(ports: list[int]) -> None:
    sel = selectors.DefaultSelector()
    listeners = []
    for port in ports:
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", port))
        lsock.listen(1024)
        lsock.setblocking(False)
        sel.register(lsock, selectors.EVENT_READ, answers(port))
        listeners.append(lsock)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print(f"min engine: {len(ports)} ports {ports[0]}..{ports[-1]}", file=sys.stderr, flush=True)
    while not stop:
        for key, _ in sel.select(0.5):
            data = key.data
            if isinstance(data, dict):  # a listener
                try:
                    sock, _ = key.fileobj.accept()
                except BlockingIOError:
                    continue
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(sock, selectors.EVENT_READ, Conn(sock, data))
                continue
            if not _on_readable(data):
                sel.unregister(data.sock)
                data.sock.close()
    for lsock in listeners:
        lsock.close()


def _on_readable(conn: Conn) -> bool:
    """Read, answer every complete request; False when the connection is done."""
    try:
        chunk = conn.sock.recv(65536)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not chunk:
        return False
    buf = conn.buf + chunk
    out = []
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            break
        head = buf[:end]
        length = 0
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            stop = lower.find(b"\r\n", at + 2)
            length = int(lower[at + 17 : stop if stop >= 0 else len(lower)])
        if lower.find(b"transfer-encoding:") >= 0:
            return False  # chunked requests are not served here
        total = end + 4 + length
        if len(buf) < total:
            break
        target = head[head.find(b" ") + 1 : head.find(b" HTTP/")]
        path = target.partition(b"?")[0]
        out.append(conn.answers.get(path) or conn.answers[b""])
        buf = buf[total:]
    conn.buf = buf
    if out:
        try:
            conn.sock.sendall(b"".join(out))  # small answers: the socket buffer takes them
        except OSError:
            return False
    return True


def parse_ports(spec: str) -> list[int]:
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ports", required=True, help="FIRST-LAST or one port")
    serve(parse_ports(ap.parse_args().ports))


if __name__ == "__main__":
    main()
