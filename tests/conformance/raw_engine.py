"""A scripted engine for smg-diff runs (loopback only; run by the project's venv python).

    python raw_engine.py PORT [PORT ...]     # prints {"ready": true, "urls": [...], "pid": N}

It answers the registration probe like a minimal SGLang, and every other path by its name, so a
case line alone decides what the engine does (the fake engines' knobs would also hit the probe):

    /echo...            200 JSON of what arrived: method, path, query, headers (no host), body
    /status/<code>      that status, JSON {"status": code} (204/304: no body; 3xx: location /echo)
    /ct/<n>             CONTENT_TYPES[n]: a given content-type and raw bytes
    /huge/<n>           200 application/json, n bytes ({"pad":"xxx..."} when n >= 10)
    /mixed              by port index: 0 -> 200, 1 -> 500, 2 -> connection closed, no answer
    /hang               no answer for 5 s (past a 1 s --rl-control-timeout-secs)
    /slowbody, /cut, /chunkbad   a body that stalls, stops short, or is badly chunked
    anything else       200 {}
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from smgrl.fake.scripted import read_requests_blocking

CONTENT_TYPES = [
    ("application/json", b'{"a":1}'),
    ("text/json", b'{"a":1}'),
    ("application/problem+json", b"[1]"),
    ("application/x-json-stream", b"2"),
    ("application/json; charset=utf-8", b'"s"'),
    ("APPLICATION/JSON", b'{"a":1}'),
    ("text/plain", b'{"a":1}'),
    (None, b'{"a":1}'),
    ("application/json", b"{bad"),
    ("application/json", b""),
    ("text/plain", b"ok\xff\xfe!"),
    ("application/json", b'"\xff"'),
    ("application/json", b"NaN"),
    ("application/json", b"-0"),
    ("application/json", b"1.0"),
    ("application/json", b'{"a":1,"a":2}'),
    ("application/json", b" [1] "),
    ("application/json", b'{"a":1} x'),
    ("application/json", b'"\\ud800"'),
    ("application/json", b"18446744073709551616"),
    ("application/json", b"-9223372036854775809"),
    ("application/json", b"1e400"),
    ("application/json", b"[" * 127 + b"]" * 127),
    ("application/json", b"[" * 128 + b"]" * 128),
    ("application/json", b'"\\ud83d\\ude00"'),
    ("application/json", b"[0.001, 1e-10, 1e22, 0.1]"),
]
PROBE = {
    "/health": b"",
    "/v1/models": json.dumps({"object": "list", "data": [{"id": "raw", "owned_by": "sglang"}]}).encode(),
    "/server_info": json.dumps(
        {"model_path": "raw", "tp_size": 1, "dp_size": 1, "version": "0.5.23"}
    ).encode(),
    "/model_info": json.dumps({"model_path": "raw"}).encode(),
}


def respond(conn, status, body=b"", ctype="application/json", extra=(), length=None):
    head = [f"HTTP/1.1 {status} X"] + ([f"content-type: {ctype}"] if ctype else []) + list(extra)
    if status not in (204, 304):
        head.append(f"content-length: {len(body) if length is None else length}")
    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


def handle(conn, index):
    with conn:
        for request in read_requests_blocking(conn):
            method, headers, body = request.method, request.headers, request.body
            path, _, query = request.target.partition("?")
            if path in PROBE:
                respond(conn, 200, PROBE[path])
            elif path.startswith("/echo"):
                seen = {k: v for k, v in sorted(headers.items()) if k != "host"}
                out = {
                    "method": method,
                    "path": path,
                    "query": query,
                    "headers": seen,
                    "body": body.decode("utf-8", "replace"),
                }
                respond(conn, 200, json.dumps(out).encode(), "application/json")
            elif path.startswith("/status/"):
                code = int(path.rsplit("/", 1)[1])
                extra = ["location: /echo/redirected"] if 300 <= code < 400 else []
                respond(conn, code, json.dumps({"status": code}).encode(), extra=extra)
            elif path.startswith("/ct/"):
                ctype, raw = CONTENT_TYPES[int(path.rsplit("/", 1)[1])]
                respond(conn, 200, raw, ctype)
            elif path.startswith("/huge/"):
                n = int(path.rsplit("/", 1)[1])
                raw = b'{"pad":"' + b"x" * (n - 10) + b'"}' if n >= 10 else b"x" * n
                respond(conn, 200, raw)
            elif path == "/mixed":
                if index == 2:
                    return  # connection closed without an answer
                respond(conn, 500 if index == 1 else 200, json.dumps({"engine": index}).encode())
            elif path == "/hang":
                time.sleep(5)
                return
            elif path == "/slowbody":
                conn.sendall(
                    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n{"a"'
                )
                time.sleep(3)
                return
            elif path == "/cut":
                respond(conn, 200, b'{"a":', length=100)
                return
            elif path == "/chunkbad":
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b'transfer-encoding: chunked\r\n\r\n5\r\n{"a":\r\nzz\r\n'
                )
                return
            else:
                respond(conn, 200, b"{}")


def serve(sock, index):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn, index), daemon=True).start()


def main():
    socks = []
    for port in sys.argv[1:] or ["0"]:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(port)))
        s.listen(64)
        socks.append(s)
    # Sorted by URL, as discovery rows are: the port index is the row index.
    socks.sort(key=lambda s: f"http://127.0.0.1:{s.getsockname()[1]}")
    for i, s in enumerate(socks):
        threading.Thread(target=serve, args=(s, i), daemon=True).start()
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in socks]
    print(json.dumps({"ready": True, "urls": urls, "pid": os.getpid()}), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
