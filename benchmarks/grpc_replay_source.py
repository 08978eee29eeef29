#!/usr/bin/env python3
"""A gRPC source for benchmarks/grpc_client.py: answers every call on any path with the same
pre-encoded Generate stream (``--messages`` length-prefixed SGLang stream chunks, then OK
trailers), as fast as the client's flow-control windows allow.

A separate process (so the client's CPU time is the client's alone), plain sockets and h2's
server state machine (which keeps the windows honest for any client), listening on 127.0.0.1.
Prints its port on one line when ready; exits when stdin closes or after ``--max-secs``.
"""

from __future__ import annotations

import argparse
import select
import socket
import sys
import threading
import time

import h2.config
import h2.connection
import h2.events
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from smgrl.upstream.grpc.framing import encode


def frames(count: int) -> list[bytes]:
    out = []
    for i in range(count):
        chunk = pb.GenerateStreamChunk(token_ids=[1000 + i % 97], prompt_tokens=12, completion_tokens=i + 1)
        out.append(encode(pb.GenerateResponse(request_id="r", chunk=chunk).SerializeToString()))
    return out


def serve_connection(sock: socket.socket, messages: list[bytes]) -> None:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    pending: dict[int, int] = {}  # stream id -> index of the next message to send
    sock.setblocking(False)
    while True:
        # Send what the windows allow, then read whatever came in.
        for sid in list(pending):
            i = pending[sid]
            while i < len(messages):
                msg = messages[i]
                if conn.local_flow_control_window(sid) < len(msg):
                    break
                conn.send_data(sid, msg)
                i += 1
            if i == len(messages):
                conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
                del pending[sid]
            else:
                pending[sid] = i
        data = conn.data_to_send()
        if data:
            sock.setblocking(True)
            sock.sendall(data)
            sock.setblocking(False)
        ready, _, _ = select.select([sock], [], [], 0 if pending and data else 1.0)
        if not ready:
            continue
        try:
            incoming = sock.recv(1 << 20)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not incoming:
            return
        for event in conn.receive_data(incoming):
            if isinstance(event, h2.events.RequestReceived):
                conn.send_headers(
                    event.stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")]
                )
                pending[event.stream_id] = 0
            elif isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                pending.pop(event.stream_id, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--max-secs", type=float, default=600)
    args = parser.parse_args()
    messages = frames(args.messages)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), listener.close()), daemon=True).start()
    deadline = time.monotonic() + args.max_secs
    listener.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_connection, args=(sock, messages), daemon=True).start()


if __name__ == "__main__":
    main()
