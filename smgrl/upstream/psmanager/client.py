"""``PSManager``: the calls PSRL's fork makes to PSRL's PSManager, on smgrl's trio gRPC client.

Service ``psrl.state.PSManagerState`` (messages in ``psrl_manager_pb2``, generated from the fork's
``.proto``). Every call is bounded by ``timeout_secs`` (connecting included); a call that fails or
runs out raises :class:`PSManagerError`, and the caller falls back as the fork does when its call
fails (``smgrl.dataplane.psrl_select``). The fork's client sets no deadline at all: a PSManager
that hangs would hang its selection; here it costs at most the bound.

Addresses as the fork accepts them: ``host:port``, ``grpc://host:port``, ``http://host:port``
(``[v6]:port`` too); ``https://`` is refused (smgrl's gRPC client speaks cleartext HTTP/2).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from smgrl.upstream.grpc import Channel, GrpcError
from smgrl.upstream.psmanager import psrl_manager_pb2 as pb

SERVICE = "/psrl.state.PSManagerState/"


class PSManagerError(Exception):
    """A PSManager call failed (status, deadline, connection). ``code``: the gRPC status name."""

    def __init__(self, method: str, code: str, message: str) -> None:
        super().__init__(f"PSManager {method} failed: {code} {message}".rstrip())
        self.method = method
        self.code = code


class InvalidPsManagerAddress(ValueError):
    pass


def parse_ps_manager_addr(addr: str) -> tuple[str, int]:
    text = addr.strip()
    for scheme in ("grpc://", "http://"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    else:
        if "://" in text:
            raise InvalidPsManagerAddress(
                f"PSManager address {addr!r}: expected host:port, grpc:// or http://"
            )
    parts = urllib.parse.urlsplit("//" + text.rstrip("/"))
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path or parts.query:
        raise InvalidPsManagerAddress(f"PSManager address {addr!r}: expected host:port")
    return parts.hostname, port


def instance_id(instance: tuple[str, int]) -> pb.RolloutInstanceId:
    return pb.RolloutInstanceId(worker_id=instance[0], dp_rank=instance[1])


class PSManager:
    def __init__(self, addr: str, *, timeout_secs: float = 0.5) -> None:
        host, port = parse_ps_manager_addr(addr)
        self.addr = f"{host}:{port}"
        self.timeout_secs = timeout_secs
        # Keep-alive pings as the fork's channel sends them (every 30 s).
        self.channel = Channel(host, port, keepalive_secs=30.0, connect_timeout_secs=timeout_secs)

    async def _call(self, method: str, request, response_type):
        try:
            return await self.channel.unary(
                SERVICE + method, request, response_type, timeout=self.timeout_secs
            )
        except GrpcError as exc:
            raise PSManagerError(method, exc.code.name, exc.message) from None

    async def can_reserve(
        self, request_ids: Sequence[int], versions: Sequence[int], is_validate: Sequence[bool]
    ) -> list[bool]:
        """Row-major ``[request, version]`` flags: may each request be reserved at each version."""
        req = pb.CanReserveRequestReq(
            request_ids=request_ids,
            model_versions=versions,
            without_new_reserve_entry=False,
            is_validate=is_validate,
        )
        return list((await self._call("CanReserveRequest", req, pb.CanReserveRequestResp)).results)

    async def reserve_indicator(
        self, request_id: int, versions: Sequence[int], is_validate: bool
    ) -> list[float]:
        req = pb.GetReserveIndicatorReq(
            request_id=request_id, model_versions=versions, is_validate=is_validate
        )
        return list((await self._call("GetReserveIndicator", req, pb.GetReserveIndicatorResp)).indicators)

    async def reserve(
        self, instance: tuple[str, int], request_id: int, version: int, is_validate: bool
    ) -> tuple[bool, str]:
        """``ReserveRolloutInstanceRequests`` for one request: (success, PSManager's message)."""
        req = pb.ReserveRolloutInstanceRequestsReq(
            rollout_instance_ids=[instance_id(instance)],
            request_ids=[request_id],
            model_versions=[version],
            guarantee_not_aborted=False,
            is_validate=is_validate,
        )
        resp = await self._call("ReserveRolloutInstanceRequests", req, pb.ReserveRolloutInstanceRequestsResp)
        return resp.success, resp.error_message

    async def update_instance(self, request_id: int, instance: tuple[str, int], is_validate: bool) -> bool:
        req = pb.UpdateRequestInstanceIdReq(
            request_id=request_id, new_instance_id=instance_id(instance), is_validate=is_validate
        )
        return (await self._call("UpdateRequestInstanceId", req, pb.UpdateRequestInstanceIdResp)).success

    async def update_version_tag(self, request_id: int, version_tag: int, is_validate: bool) -> bool:
        req = pb.UpdateRequestVersionTagReq(
            request_id=request_id, new_version_tag=version_tag, is_validate=is_validate
        )
        return (await self._call("UpdateRequestVersionTag", req, pb.UpdateRequestVersionTagResp)).success

    async def check_aborted(self, request_ids: Sequence[int], remove: bool = True) -> list[bool]:
        req = pb.CheckAbortedRequestsReq(request_ids=request_ids, remove=remove)
        return list((await self._call("CheckAbortedRequests", req, pb.CheckAbortedRequestsResp)).is_aborted)

    async def check_aborted_versions(self, versions: Sequence[int]) -> list[bool]:
        req = pb.CheckAbortedModelVersionsReq(model_versions=versions)
        return list(
            (await self._call("CheckAbortedModelVersions", req, pb.CheckAbortedModelVersionsResp)).is_aborted
        )

    async def instance_version(self, instance: tuple[str, int]) -> int:
        req = pb.GetRolloutInstanceModelVersionReq(rollout_instance_id=instance_id(instance))
        resp = await self._call("GetRolloutInstanceModelVersion", req, pb.GetRolloutInstanceModelVersionResp)
        return resp.model_version

    async def update_status(
        self,
        request_ids: Sequence[int],
        status: str,
        versions: Sequence[int],
        instances: Sequence[tuple[str, int]],
        is_validate: bool,
    ) -> list[bool]:
        req = pb.UpdateRequestStatusReq(
            request_ids=request_ids,
            status=status,
            model_versions=versions,
            rollout_instance_ids=[instance_id(i) for i in instances],
            is_validate=is_validate,
        )
        return list((await self._call("UpdateRequestStatus", req, pb.UpdateRequestStatusResp)).succeeded)

    async def aclose(self) -> None:
        await self.channel.aclose()
