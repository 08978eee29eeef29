"""The body of ``POST /v1/rl/refits``, validated (pure). Bad input -> ``InvalidBody`` naming the
field; every error is a 400 with a stable code."""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from smgrl.core import MalformedVersion as BadVersion
from smgrl.core import Selector, SelectorError, parse_selector, validate_version
from smgrl.core.errors import InvalidBody, InvalidSelector, InvalidVersion
from smgrl.refit.plan import DEFAULT_GROUP, DistributedSource

ON_FAILURE = ("quarantine", "rollback", "abort")
FIELDS = frozenset(
    {
        "selector",
        "source",
        "weight_version",
        "pause_mode",
        "flush",
        "on_failure",
        "force",
        "transfer_timeout_secs",
    }
)
DEFAULT_TRANSFER_TIMEOUT = 600.0
MAX_TRANSFER_TIMEOUT = 86400.0
# Every text field is short by nature (a path: PATH_MAX is 4096; an address, a mode, a name), and
# the plan repeats some of them per engine and per call: unbounded, one request with a 100,000-
# character model_path wrote a 302 KB refit.started for two engines (x32 for 64 engines, and up
# to --max-payload-size per field).
MAX_TEXT = 4096
MAX_CHECKSUMS = 200_000  # tensor names -> checksum; a 1T-parameter MoE has ~100k tensors
MAX_CHECKSUM_TEXT = 1024


@attrs.frozen
class RefitRequest:
    selector: Selector
    source: str  # disk | distributed
    weight_version: str
    model_path: str | None = None
    dist: DistributedSource | None = None
    pause_mode: str | None = None
    flush: bool = True
    on_failure: str = "quarantine"
    force: bool = False
    transfer_timeout_secs: float = DEFAULT_TRANSFER_TIMEOUT


def _bad(message: str) -> InvalidBody:
    return InvalidBody(f"invalid refit request: {message}")


def _str(obj: dict, key: str, *, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _bad(f"`{key}` is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise _bad(f"`{key}` must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise _bad(f"`{key}` is longer than {MAX_TEXT} characters")
    return value


def _bool(obj: dict, key: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise _bad(f"`{key}` must be true or false")
    return value


def parse_refit(data: bytes) -> RefitRequest:
    try:
        body = json.loads(data or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _bad("the body is not JSON") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise _bad(f"unknown field `{unknown[0][:100]}`")
    source_text = _str(body, "selector", required=True)
    try:
        selector = parse_selector(source_text.strip())
    except SelectorError as exc:
        raise InvalidSelector(str(exc), offset=exc.offset) from None
    raw_version = body.get("weight_version")
    if not isinstance(raw_version, str):
        raise _bad("`weight_version` is required and must be a string")
    try:
        version = validate_version(raw_version)
    except BadVersion as exc:
        raise InvalidVersion(str(exc)) from None
    source = body.get("source")
    if not isinstance(source, dict) or len(source) != 1 or next(iter(source)) not in ("disk", "distributed"):
        raise _bad('`source` must be {"disk": {"model_path": ...}} or {"distributed": {...}}')
    kind, spec = next(iter(source.items()))
    if not isinstance(spec, dict):
        raise _bad(f"`source.{kind}` must be an object")
    model_path, dist = None, None
    if kind == "disk":
        model_path = _str(spec, "model_path", required=True)
    else:
        dist = _distributed(spec)
    on_failure = body.get("on_failure", "quarantine")
    if on_failure not in ON_FAILURE:
        raise _bad(f"`on_failure` must be one of {', '.join(ON_FAILURE)}")
    timeout = body.get("transfer_timeout_secs", DEFAULT_TRANSFER_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TRANSFER_TIMEOUT
    ):
        raise _bad(f"`transfer_timeout_secs` must be a number in (0, {MAX_TRANSFER_TIMEOUT:g}]")
    return RefitRequest(
        selector=selector,
        source=kind,
        weight_version=version,
        model_path=model_path,
        dist=dist,
        pause_mode=_str(body, "pause_mode"),
        flush=_bool(body, "flush", True),
        on_failure=on_failure,
        force=_bool(body, "force", False),
        transfer_timeout_secs=float(timeout),
    )


def _distributed(spec: dict[str, Any]) -> DistributedSource:
    allowed = {"master_address", "master_port", "group_name", "backend", "checksums"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise _bad(f"unknown field `source.distributed.{unknown[0][:100]}`")
    address = _str(spec, "master_address", required=True)
    port = spec.get("master_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise _bad("`source.distributed.master_port` must be an integer in 1..65535")
    backend = _str(spec, "backend") or "nccl"
    if backend not in ("nccl", "gloo"):
        raise _bad("`source.distributed.backend` must be nccl or gloo")
    checksums = spec.get("checksums")
    if checksums is not None and (
        not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values())
    ):
        raise _bad("`source.distributed.checksums` must map tensor names to strings")
    if checksums is not None and (
        len(checksums) > MAX_CHECKSUMS
        or any(len(k) > MAX_CHECKSUM_TEXT or len(v) > MAX_CHECKSUM_TEXT for k, v in checksums.items())
    ):
        raise _bad(
            f"`source.distributed.checksums` holds at most {MAX_CHECKSUMS} entries of at most "
            f"{MAX_CHECKSUM_TEXT} characters each"
        )
    return DistributedSource(
        master_address=address,
        master_port=port,
        group_name=_str(spec, "group_name") or DEFAULT_GROUP,
        backend=backend,
        checksums=checksums,
    )
