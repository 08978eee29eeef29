"""Ask an engine what it is (the HTTP side of discovery; the decisions live in core.discovery).

The requests are SMG's registration traffic: ``GET /health``, ``GET /v1/models``, then for SGLang
``GET /server_info`` (``/get_server_info`` on 404) and ``GET /model_info`` (``/get_model_info`` on
404); for vLLM (``owned_by: vllm``) ``GET /version``. gRPC/ZMQ workers have no HTTP data URL:
their labels come from the control app's ``GET /get_server_info`` when ``rl.control_url`` is
known (TokenSpeed serves it SGLang-shaped).

Where that lives differs between TokenSpeed deployments: the ``ts serve`` control sidecar serves
``/get_server_info`` (and forwards the RL routes), while the in-engine RL control app behind
``--rl-control-port`` only has ``/model_info`` (docs/engines.md, TokenSpeed). A label may name either, so a
control app that answers 404 to both server-info paths is asked for ``/model_info`` instead (model
path and weight version; no ``rl.*`` advertisement, so the static TokenSpeed row applies).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs
import trio

from smgrl.core import Discovery, control_url_for, grpc_labels, is_vllm, origin_of, sglang_labels, vllm_labels
from smgrl.upstream import PoolSet, UpstreamError

PROBE_BODY_CAP = 4 * 1024 * 1024
GATEWAY_ID_HEADER = "x-smgrl-gateway-id"


class ProbeFailed(Exception):
    """The engine is not (yet) able to answer discovery; the job retries with backoff."""


class ReachesSelf(Exception):
    """The worker URL answered ``GET /health`` with this gateway's own id: registering it would
    route rollouts back into this gateway (a loop until the request times out)."""


async def _get(
    pools: PoolSet, base: str, path: str, api_key: str | None, timeout: float, self_id: str | None = None
) -> tuple[int, bytes]:
    response, data = await fetch(pools, base, path, api_key, timeout, self_id)
    return response.status, data


async def fetch(
    pools: PoolSet, base: str, path: str, api_key: str | None, timeout: float, self_id: str | None = None
):
    """``GET base+path`` with the worker's key: ``(response, body)`` (the body at most
    ``PROBE_BODY_CAP``); ProbeFailed when it gets no answer, ReachesSelf when this gateway
    answered."""
    headers = [(b"accept", b"*/*")]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode("latin-1")))
    try:
        origin = origin_of(base)
        prefix = base[len(origin) :].rstrip("/")  # a path prefix the engine is served under
        if prefix and not prefix.startswith("/"):
            raise ValueError(f"URL `{base}` has a query or fragment")
        with trio.fail_after(timeout):
            response, data, _ = await pools.get(origin).request(
                "GET", prefix + path, headers=headers, limit=PROBE_BODY_CAP
            )
    except trio.TooSlowError:
        raise ProbeFailed(f"GET {path}: timed out after {timeout:g}s") from None
    except (UpstreamError, OSError) as exc:
        raise ProbeFailed(f"GET {path}: {exc}") from None
    except ValueError as exc:
        # A URL no pool can be built for (an ``rl.control_url`` label like ``ftp://...`` or
        # ``10.0.0.5:40100``): the label is the caller's to fix; the job retries meanwhile.
        raise ProbeFailed(f"GET {base}{path}: {exc}") from None
    if self_id and response.header(GATEWAY_ID_HEADER.encode()) == self_id.encode():
        raise ReachesSelf(f"GET {path} answered with this gateway's id ({GATEWAY_ID_HEADER})")
    return response, data


def _json(data: bytes) -> Mapping | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: deeply nested JSON from an engine must not escape the registry job (it
        # would tear down the gateway's nursery; tests/unit/test_more_properties.py).
        return None
    return value if isinstance(value, Mapping) else None


async def _get_json(pools, base, paths, api_key, timeout) -> Mapping | None:
    """First path that answers 2xx JSON; a 404 tries the next (deprecated alias) path."""
    for path in paths:
        status, data = await _get(pools, base, path, api_key, timeout)
        if 200 <= status < 300:
            return _json(data)
        if status != 404:
            return None
    return None


# Keyword parameters, shaped like other signatures (dataplane/service.py): each function its own.
async def probe_http(
    pools: PoolSet,
    base_url: str,
    api_key: str | None,
    timeout: float,
    runtime: str | None = None,
    self_id: str | None = None,
) -> Discovery:
    """``runtime`` is the registration's hint: as in SMG, ``vllm`` takes the vLLM path whatever
    ``/v1/models`` says, and a hint names the engine even when detection would say otherwise.
    ``self_id``: this gateway's id; a ``/health`` answering with it raises ``ReachesSelf``."""
    status, _ = await _get(pools, base_url, "/health", api_key, timeout, self_id)
    if not 200 <= status < 300:
        raise ProbeFailed(f"GET /health answered {status}")
    hint = runtime if runtime and runtime != "unspecified" else None
    models = await _get_json(pools, base_url, ["/v1/models"], api_key, timeout)
    if hint == "vllm" or (hint is None and is_vllm(models)):
        version = await _get_json(pools, base_url, ["/version"], api_key, timeout)
        return vllm_labels(models, version)
    server_info = await _get_json(pools, base_url, ["/server_info", "/get_server_info"], api_key, timeout)
    model_info = await _get_json(pools, base_url, ["/model_info", "/get_model_info"], api_key, timeout)
    found = sglang_labels(server_info, model_info, models)
    return attrs.evolve(found, runtime=hint) if hint else found


async def probe_control_app(
    pools: PoolSet,
    worker_url: str,
    labels: Mapping[str, str],
    runtime: str | None,
    api_key: str | None,
    timeout: float,
    connection_mode: str = "grpc",
) -> Discovery:
    """Discovery for a gRPC/ZMQ worker: nothing without a control URL (the row then shows
    ``control_url: null`` and calls answer ``no_control_endpoint``), else its control app's
    server info. The worker key goes along as bearer: the control app is the one place that key
    is for (an unreachable control app is a retryable ``ProbeFailed``)."""
    control = control_url_for(connection_mode, worker_url, worker_url, labels)
    if control is None:
        return Discovery(runtime=runtime or "unspecified", labels={}, model_id=None, dp_size=None)
    info = await _get_json(pools, control, ["/get_server_info", "/server_info"], api_key, timeout)
    if info is None:
        info = await _get_json(pools, control, ["/model_info", "/get_model_info"], api_key, timeout)
    if info is None:
        raise ProbeFailed(
            f"the control app at {control} answered neither GET /get_server_info nor GET /model_info "
            "with JSON"
        )
    hint = runtime if runtime and runtime != "unspecified" else None
    guessed = hint or ("tokenspeed" if "tokenspeed_version" in info else "unspecified")
    return grpc_labels(info, guessed)
