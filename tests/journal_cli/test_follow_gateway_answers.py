"""``smgrl journal events --follow --gateway URL`` against a server that answers badly (regression):
its error text reached the terminal unescaped (an ANSI escape in ``message`` was printed raw), and
a malformed event (``data: [1]`` as hello, a string ``seq``) ended in a Python traceback. A real
HTTP server on loopback plays the gateway."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading

import pytest


def serve(status: int, body: bytes, content_type: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def follow(port: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "smgrl",
            "journal",
            "events",
            "--follow",
            "--gateway",
            f"http://127.0.0.1:{port}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_refusal_message_is_escaped_on_the_terminal():
    server = serve(
        403, b'{"error": "forbidden", "message": "no \\u001b[31mred\\u001b[0m\\nline"}', "application/json"
    )
    try:
        result = follow(server.server_address[1])
    finally:
        server.shutdown()
    assert result.returncode != 0
    assert "\x1b" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "(403): no \\x1b[31mred\\x1b[0m\\nline" in lines[0], lines


@pytest.mark.parametrize(
    "stream",
    [
        b"event: hello\ndata: [1]\n\n",
        b'event: hello\ndata: {"last_seq": "x"}\n\n',
        b'event: hello\ndata: {"last_seq": 0}\n\nevent: journal\ndata: {"seq": "7"}\n\n',
    ],
)
def test_a_malformed_event_is_a_lost_stream_not_a_traceback(stream):
    server = serve(200, stream, "text/event-stream")
    try:
        result = follow(server.server_address[1])
    finally:
        server.shutdown()
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode != 0
    assert result.stderr.splitlines()[-1].startswith("error: lost the journal stream"), result.stderr
