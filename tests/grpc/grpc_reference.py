"""A grpcio server for the differential tests, and grpcio's own client as the reference.

The service ``smgrl.test.Diff`` speaks ``GetTokenizerChunk`` both ways (bytes + string: enough
to say what to do and to carry any payload):

- ``Echo`` (unary): answers the request; ``sha256 = "code:CODE:message"`` fails with that status
  (trailing metadata ``x-why: <message>``); ``sha256 = "sleep:S"`` sleeps S seconds first;
  ``sha256 = "big:N"`` answers N bytes.
  ``sha256 = "meta"`` answers the request's ``x-*`` metadata and sends initial metadata.
- ``Count`` (server stream): ``len(data)`` messages, then the status ``sha256`` names (as Echo);
  ``sha256 = "slow"``: one message, then one every 20 ms until the client cancels (recorded).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from smg_grpc_proto.generated.common_pb2 import GetTokenizerChunk as Msg

SERVICE = "smgrl.test.Diff"


class Reference:
    def __init__(self):
        self.cancelled: list[str] = []  # request data of "slow" streams the client cancelled
        self.lock = threading.Lock()

    def _status(self, spec: str, context) -> None:
        if spec.startswith("code:"):
            _, name, message = spec.split(":", 2)
            context.set_trailing_metadata((("x-why", message.encode("ascii", "replace").decode()),))
            context.abort(getattr(grpc.StatusCode, name), message)
        if spec.startswith("sleep:"):
            time.sleep(float(spec[6:]))

    def echo(self, req: Msg, context) -> Msg:
        if req.sha256 == "meta":
            # The request's metadata back, and initial metadata of our own.
            context.send_initial_metadata((("x-initial", "yes"),))
            seen = sorted(f"{k}={v}" for k, v in context.invocation_metadata() if k.startswith("x-"))
            return Msg(data=";".join(seen).encode())
        self._status(req.sha256, context)
        if req.sha256.startswith("big:"):
            return Msg(data=b"x" * int(req.sha256[4:]))
        return Msg(data=req.data, sha256="echo")

    def count(self, req: Msg, context):
        if req.sha256 == "slow":
            done = []

            def ended():
                # grpcio stops iterating a cancelled call's generator: its end is seen here.
                if not done:
                    with self.lock:
                        self.cancelled.append(req.data.decode())

            context.add_callback(ended)
            yield Msg(data=b"0")
            for i in range(1, 500):
                time.sleep(0.02)
                yield Msg(data=str(i).encode())
            done.append(True)
            return
        for i in range(len(req.data)):
            yield Msg(data=req.data[: i + 1], sha256=str(i))
        self._status(req.sha256, context)


def serve(options: tuple = (), workers: int = 32) -> tuple[grpc.Server, int, Reference]:
    ref = Reference()
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                ref.echo, request_deserializer=Msg.FromString, response_serializer=Msg.SerializeToString
            ),
            "Count": grpc.unary_stream_rpc_method_handler(
                ref.count, request_deserializer=Msg.FromString, response_serializer=Msg.SerializeToString
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, ref


def grpcio_call(port: int, method: str, req: Msg, timeout: float | None = None, stream: bool = False):
    """The outcome through grpcio's client: ("ok", [bytes...]) or ("error", code name, details,
    trailers); a stream that fails midway returns the messages before it too."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        path = f"/{SERVICE}/{method}"
        got: list[bytes] = []
        try:
            if stream:
                call = channel.unary_stream(path, Msg.SerializeToString, Msg.FromString)
                for msg in call(req, timeout=timeout):
                    got.append(msg.SerializeToString())
            else:
                call = channel.unary_unary(path, Msg.SerializeToString, Msg.FromString)
                got.append(call(req, timeout=timeout).SerializeToString())
        except grpc.RpcError as exc:
            trailers = tuple((k, v) for k, v in (exc.trailing_metadata() or ()))
            return ("error", exc.code().name, exc.details(), trailers, got)
        return ("ok", got)
