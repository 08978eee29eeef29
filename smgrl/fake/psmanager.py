"""A fake PSRL PSManager (``psrl.state.PSManagerState``) on grpcio, with scriptable answers.

PSRL's servicer (PSRL 19c0474 psrl/grpc/ps_manager_service.py) answers from its parameter
server's staleness buffers; this fake answers from a :class:`Script` a test sets, and records
every call::

    fake = FakePSManager().start()          # fake.addr == "127.0.0.1:PORT"
    fake.script.reservable = {2}            # CanReserveRequest: only version 2 has room
    fake.script.indicators = {1: 0.5, 2: 0.1}
    fake.script.aborted = {17}              # CheckAbortedRequests: request 17 was aborted
    fake.script.delay_secs = 2.0            # every answer late (a slow PSManager)
    fake.script.fail = grpc.StatusCode.UNAVAILABLE
    fake.calls("CanReserveRequest")         # the requests received, in order
    fake.stop()

Out of process: ``python -m smgrl.fake.psmanager --port 0`` prints ``{"addr": ...}`` once
serving and answers with the default script (everything reservable, nothing aborted but the
request ids given with ``--aborted``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent import futures

import attrs
import grpc

from smgrl.upstream.psmanager import psrl_manager_pb2 as pb

SERVICE = "psrl.state.PSManagerState"


@attrs.define
class Script:
    reservable: set[int] | None = None  # versions CanReserveRequest says yes to (None: all)
    indicators: dict[int, float] = attrs.Factory(dict)  # GetReserveIndicator per version (0.0 else)
    reserve_ok: bool = True  # ReserveRolloutInstanceRequests' success
    reserve_error: str = ""
    update_instance_ok: bool = True
    update_version_ok: bool = True
    aborted: set[int] = attrs.Factory(set)  # request ids CheckAbortedRequests reports
    aborted_versions: set[int] = attrs.Factory(set)
    instance_versions: dict[tuple[str, int], int] = attrs.Factory(dict)
    delay_secs: float = 0.0  # every answer this late
    fail: grpc.StatusCode | None = None  # every call ends with this status
    fail_only: frozenset[str] | None = None  # ... only these methods (None: all)


class FakePSManager:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script = Script()
        self._host, self._port = host, port
        self._calls: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._released = threading.Event()  # set at stop: late answers stop waiting
        self.addr = ""

    def calls(self, method: str | None = None) -> list:
        with self._lock:
            return [req for name, req in self._calls if method is None or name == method]

    def start(self) -> FakePSManager:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._wrap(name, fn),
                request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString,
            )
            for name, (req, resp, fn) in self._methods().items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        port = server.add_insecure_port(f"{self._host}:{self._port}")
        server.start()
        self._server = server
        self.addr = f"{self._host}:{port}"
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def _wrap(self, name, fn):
        def handler(request, context):
            with self._lock:
                self._calls.append((name, request))
            script = self.script
            if script.delay_secs:
                self._released.wait(script.delay_secs)
            if script.fail is not None and (script.fail_only is None or name in script.fail_only):
                context.abort(script.fail, f"scripted failure of {name}")
            return fn(request, script)

        return handler

    def _methods(self):
        return {
            "CanReserveRequest": (pb.CanReserveRequestReq, pb.CanReserveRequestResp, _can_reserve),
            "GetReserveIndicator": (pb.GetReserveIndicatorReq, pb.GetReserveIndicatorResp, _indicator),
            "ReserveRolloutInstanceRequests": (
                pb.ReserveRolloutInstanceRequestsReq,
                pb.ReserveRolloutInstanceRequestsResp,
                _reserve,
            ),
            "UpdateRequestInstanceId": (
                pb.UpdateRequestInstanceIdReq,
                pb.UpdateRequestInstanceIdResp,
                _update_instance,
            ),
            "UpdateRequestVersionTag": (
                pb.UpdateRequestVersionTagReq,
                pb.UpdateRequestVersionTagResp,
                _update_version,
            ),
            "CheckAbortedRequests": (pb.CheckAbortedRequestsReq, pb.CheckAbortedRequestsResp, _check_aborted),
            "CheckAbortedModelVersions": (
                pb.CheckAbortedModelVersionsReq,
                pb.CheckAbortedModelVersionsResp,
                _check_aborted_versions,
            ),
            "GetRolloutInstanceModelVersion": (
                pb.GetRolloutInstanceModelVersionReq,
                pb.GetRolloutInstanceModelVersionResp,
                _instance_version,
            ),
            "UpdateRequestStatus": (pb.UpdateRequestStatusReq, pb.UpdateRequestStatusResp, _update_status),
        }


def _can_reserve(req, s: Script):
    row = [s.reservable is None or v in s.reservable for v in req.model_versions]
    return pb.CanReserveRequestResp(results=row * len(req.request_ids), n_versions=len(req.model_versions))


def _indicator(req, s: Script):
    return pb.GetReserveIndicatorResp(indicators=[s.indicators.get(v, 0.0) for v in req.model_versions])


def _reserve(req, s: Script):
    n = len(req.request_ids)
    return pb.ReserveRolloutInstanceRequestsResp(
        success=s.reserve_ok, buffer_ids=[0] * n, entry_ids=list(range(n)), error_message=s.reserve_error
    )


def _update_instance(req, s: Script):
    return pb.UpdateRequestInstanceIdResp(success=s.update_instance_ok)


def _update_version(req, s: Script):
    return pb.UpdateRequestVersionTagResp(success=s.update_version_ok)


def _check_aborted(req, s: Script):
    flags = [rid in s.aborted for rid in req.request_ids]
    if req.remove:
        s.aborted.difference_update(req.request_ids)
    return pb.CheckAbortedRequestsResp(is_aborted=flags)


def _check_aborted_versions(req, s: Script):
    return pb.CheckAbortedModelVersionsResp(is_aborted=[v in s.aborted_versions for v in req.model_versions])


def _instance_version(req, s: Script):
    key = (req.rollout_instance_id.worker_id, req.rollout_instance_id.dp_rank)
    return pb.GetRolloutInstanceModelVersionResp(model_version=s.instance_versions.get(key, 0))


def _update_status(req, s: Script):
    return pb.UpdateRequestStatusResp(succeeded=[True] * len(req.request_ids))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m smgrl.fake.psmanager")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--aborted", type=int, nargs="*", default=[], help="request ids reported aborted")
    opts = parser.parse_args(argv)
    fake = FakePSManager(opts.host, opts.port)
    fake.script.aborted = set(opts.aborted)
    fake.start()
    print(json.dumps({"addr": fake.addr}), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()


if __name__ == "__main__":
    sys.exit(main())
