"""An answer sent before the request body was read reaches a client still sending that body
(RFC 9112 section 9.6): the real gateway on loopback (smgrl's own HTTP server),
a raw socket client that sends its whole 2 MiB body in pieces after the head, as urllib3/requests
do, and only then reads. Before the graceful close, the gateway closed with the body unread and
the kernel reset the connection: the client's send failed and the answer was lost."""

from __future__ import annotations

import json

import pytest
import trio

from smgrl.core.config import Config, RlConfig
from smgrl.testing.dataplane import gateway_on_loopback

BODY = 2 * 1024 * 1024
PIECE = 64 * 1024


async def send_slowly_then_read(base: str, head: bytes) -> bytes:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    with trio.fail_after(30):
        await stream.send_all(head)
        for _ in range(BODY // PIECE):
            await stream.send_all(b"x" * PIECE)  # a reset here loses the answer
            await trio.sleep(0.002)  # pacing: a client on a slower link
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    return received


@pytest.mark.parametrize(
    "cfg, head, status, code",
    [
        # The data plane refuses a declared length over --max-payload-size before reading.
        (
            Config(max_payload_size=1024 * 1024),
            b"POST /generate HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n",
            413,
            "request_body_too_large",
        ),
        # The control plane refuses a missing key before reading the body.
        (
            Config(api_key="sekrit", rl=RlConfig(enabled=True)),
            b"POST /v1/rl/engine/flush_cache?selector=engine%3Dsglang HTTP/1.1\r\nhost: t\r\n",
            401,
            None,
        ),
    ],
)
async def test_an_early_answer_reaches_a_client_still_sending_its_body(cfg, head, status, code):
    async with gateway_on_loopback(cfg) as gw:
        received = await send_slowly_then_read(gw.base, head + b"content-length: %d\r\n\r\n" % BODY)
    raw_head, _, body = received.partition(b"\r\n\r\n")
    assert raw_head.startswith(b"HTTP/1.1 %d" % status), raw_head[:60]
    length = int(dict(line.split(b": ", 1) for line in raw_head.split(b"\r\n")[1:])[b"content-length"])
    assert len(body) == length  # the whole answer, then the gateway's close
    if code is not None:
        assert json.loads(body)["error"]["code"] == code
