"""Ask an engine what it is (the HTTP side of discovery; the decisions live in core.discovery).

The requests are SMG's registration traffic: ``GET /health``, ``GET /v1/models``, then for SGLang
``GET /server_info`` (``/get_server_info`` on 404) and ``GET /model_info`` (``/get_model_info`` on
404); for vLLM (``owned_by: vllm``) ``GET /version``. gRPC/ZMQ workers have no HTTP data URL:
their labels come from the control app's ``GET /get_server_info`` when ``rl.control_url`` is
known (TokenSpeed serves it SGLang-shaped).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import trio

from smgrl.core.control_url import resolve_control_url
from smgrl.core.discovery import Discovery, grpc_labels, is_vllm, sglang_labels, vllm_labels
from smgrl.upstream import PoolSet, UpstreamError

PROBE_BODY_CAP = 4 * 1024 * 1024


class ProbeFailed(Exception):
    """The engine is not (yet) able to answer discovery; the job retries with backoff."""


async def _get(
    pools: PoolSet, base: str, path: str, api_key: str | None, timeout: float
) -> tuple[int, bytes]:
    headers = [(b"accept", b"*/*")]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode("latin-1")))
    scheme, _, rest = base.partition("://")
    authority, slash, prefix = rest.partition("/")
    target = ("/" + prefix.rstrip("/") if slash and prefix.strip("/") else "") + path
    try:
        with trio.fail_after(timeout):
            response, data, _ = await pools.get(f"{scheme}://{authority}").request(
                "GET", target, headers=headers, limit=PROBE_BODY_CAP
            )
    except trio.TooSlowError:
        raise ProbeFailed(f"GET {path}: timed out after {timeout:g}s") from None
    except (UpstreamError, OSError) as exc:
        raise ProbeFailed(f"GET {path}: {exc}") from None
    return response.status, data


def _json(data: bytes) -> Mapping | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
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


async def probe_http(pools: PoolSet, base_url: str, api_key: str | None, timeout: float) -> Discovery:
    status, _ = await _get(pools, base_url, "/health", api_key, timeout)
    if not 200 <= status < 300:
        raise ProbeFailed(f"GET /health answered {status}")
    models = await _get_json(pools, base_url, ["/v1/models"], api_key, timeout)
    if is_vllm(models):
        version = await _get_json(pools, base_url, ["/version"], api_key, timeout)
        return vllm_labels(models, version)
    server_info = await _get_json(pools, base_url, ["/server_info", "/get_server_info"], api_key, timeout)
    model_info = await _get_json(pools, base_url, ["/model_info", "/get_model_info"], api_key, timeout)
    return sglang_labels(server_info, model_info, models)


async def probe_control_app(
    pools: PoolSet,
    worker_url: str,
    labels: Mapping[str, str],
    runtime: str | None,
    api_key: str | None,
    timeout: float,
) -> Discovery:
    advertised = labels.get("rl.control_url", "")
    if not advertised.strip():
        return Discovery(runtime=runtime or "unspecified", labels={}, model_id=None, dp_size=None)
    control = resolve_control_url(advertised, worker_url)
    info = await _get_json(pools, control, ["/get_server_info", "/server_info"], api_key, timeout)
    if info is None:
        raise ProbeFailed("the control app did not answer GET /get_server_info with JSON")
    guessed = runtime or ("tokenspeed" if "tokenspeed_version" in info else "unspecified")
    return grpc_labels(info, guessed)
