"""PSRL routing metadata, read from a rollout request's headers and body. Pure.

Headers win over the body fields they name (docs/data-plane.md, "PSRL routing")::

    x-request-id      request_id                  the request's identity (any string; smgrl
                                                  generates one when absent; one that is not
                                                  1-128 printable ASCII is ignored, never refused)
    x-prompt-id       prompt_id                   the prompt group (GRPO group): its pin
    x-version-tag     version_tag                 version floor; -1 = unversioned (pinned at
                                                  the first commit)
    x-is-validate     is_validate                 bool-like; handed to the admission hook
    x-is-sticky       is_sticky                   bool-like; honour the instance hint
    x-base-worker-id  rollout_instance_id /       the instance hint (worker, DP rank): both
    x-target-dp-rank  rollout_instance_hint /     parts or neither
                      base_worker_id+target_dp_rank
    x-force-pin-once  -                           bool-like; honour the hint for the first
                                                  selection of this request only

Bool-like: ``1 true t yes y`` / ``0 false f no n``, case-insensitive, trimmed. Deviation from
PSRL: ids are strings (PSRL parses i64), so smgrl's own ``gnt-...`` ids and textual prompt ids
work; a request without a prompt id still routes (plain path), where PSRL's selector would refuse.

A malformed value is :class:`InvalidRoutingMetadata` (400 ``invalid_routing_metadata``, naming
the header or field); ``x-version-tag`` keeps its older ``invalid_version_policy`` error
(``smgrl.routing.version_policy.parse_floor``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from smgrl.core import Version, rust_trim
from smgrl.routing.version_policy import parse_floor

HEADERS = (
    "x-request-id",
    "x-prompt-id",
    "x-version-tag",
    "x-is-validate",
    "x-is-sticky",
    "x-base-worker-id",
    "x-target-dp-rank",
    "x-force-pin-once",
)
TRUE = frozenset({"1", "true", "t", "yes", "y"})
FALSE = frozenset({"0", "false", "f", "no", "n"})
MAX_ID_BYTES = 128
_WORKER_KEYS = ("base_worker_id", "worker_id", "replica_id")
_RANK_KEYS = ("target_dp_rank", "dp_rank", "data_parallel_rank")


class InvalidRoutingMetadata(ValueError):
    code = "invalid_routing_metadata"

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"invalid `{name}`: {message}")
        self.name = name


@attrs.frozen(slots=True)
class InstanceId:
    """PSRL's instance identity ``(base_worker_id, dp_rank)``. ``worker`` is the registry id of
    the engine's rank-0 record (what ``x-base-worker-id`` echoes) or, on input, its URL."""

    worker: str
    rank: int


@attrs.frozen(slots=True)
class RoutingMeta:
    request_id: str | None = None
    prompt_id: str | None = None
    version_tag: str | None = None  # the raw floor (None: unversioned, -1)
    floor: Version | None = None
    is_validate: bool = False
    is_sticky: bool = False
    hint: InstanceId | None = None
    force_pin_once: bool = False

    @property
    def staged(self) -> bool:
        """Does the request take the staged (PSRL) selection? With a prompt group or an
        instance hint; anything else keeps the plain path (floor + policy), unchanged."""
        return self.prompt_id is not None or self.hint is not None


PLAIN = RoutingMeta()


def parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = rust_trim(value).lower()
        if low in TRUE:
            return True
        if low in FALSE:
            return False
    raise InvalidRoutingMetadata(name, "expected one of 1,true,t,yes,y / 0,false,f,no,n")


def parse_id(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidRoutingMetadata(name, "expected a string or an integer")
    text = rust_trim(str(value))
    raw = text.encode("utf-8", "surrogatepass")
    if not text or len(raw) > MAX_ID_BYTES or not all(0x21 <= b <= 0x7E for b in raw):
        raise InvalidRoutingMetadata(name, f"expected 1-{MAX_ID_BYTES} printable ASCII characters")
    return text


def parse_rank(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidRoutingMetadata(name, "expected a non-negative integer")
    if isinstance(value, int):
        rank = value
    elif isinstance(value, str) and rust_trim(value).isascii() and rust_trim(value).isdigit():
        rank = int(rust_trim(value))
    else:
        raise InvalidRoutingMetadata(name, "expected a non-negative integer")
    if not 0 <= rank < 1 << 16:
        raise InvalidRoutingMetadata(name, "expected a non-negative integer below 65536")
    return rank


def _body_hint(body: Mapping[str, Any]) -> InstanceId | None:
    for key in ("rollout_instance_id", "rollout_instance_hint"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, list) and len(value) == 2:
            return InstanceId(parse_id(key, value[0]), parse_rank(key, value[1]))
        if isinstance(value, dict):
            worker = next((value[k] for k in _WORKER_KEYS if value.get(k) is not None), None)
            rank = next((value[k] for k in _RANK_KEYS if value.get(k) is not None), None)
            if worker is not None and rank is not None:
                return InstanceId(parse_id(key, worker), parse_rank(key, rank))
        raise InvalidRoutingMetadata(key, "expected [worker_id, dp_rank] or {base_worker_id, target_dp_rank}")
    worker, rank = body.get("base_worker_id"), body.get("target_dp_rank")
    if worker is None and rank is None:
        return None
    if worker is None or rank is None:
        raise InvalidRoutingMetadata("base_worker_id", "needs target_dp_rank too (both or neither)")
    return InstanceId(parse_id("base_worker_id", worker), parse_rank("target_dp_rank", rank))


def parse(header: Callable[[str], str | None], body: Mapping[str, Any] | None = None) -> RoutingMeta:
    """The request's routing metadata. ``header(name)`` answers a header's value or None."""
    body = body if body is not None else {}

    def pick(name: str, field: str | None) -> tuple[str, Any]:
        value = header(name)
        if value is not None:
            return name, value
        if field is not None and body.get(field) is not None:
            return field, body[field]
        return name, None

    name, value = pick("x-request-id", "request_id")
    # Never a reason to refuse a request: SMG serves any x-request-id (one over 128 characters is
    # replaced by a generated id), and the id names the request without routing it. One that is
    # not a PSRL id (1-128 printable ASCII) is left out of the metadata.
    try:
        request_id = parse_id(name, value) if value is not None else None
    except InvalidRoutingMetadata:
        request_id = None
    name, value = pick("x-prompt-id", "prompt_id")
    prompt_id = parse_id(name, value) if value is not None else None
    name, value = pick("x-version-tag", "version_tag")
    version_tag = None
    floor = None
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise InvalidRoutingMetadata(name, "expected a version or -1")
        floor = parse_floor(str(value))  # InvalidVersionPolicy: the older 400 code
        version_tag = None if floor is None else floor.raw
    flags = {}
    for head, field in (
        ("x-is-validate", "is_validate"),
        ("x-is-sticky", "is_sticky"),
        ("x-force-pin-once", None),
    ):
        name, value = pick(head, field)
        flags[head] = parse_bool(name, value) if value is not None else False
    worker, rank = header("x-base-worker-id"), header("x-target-dp-rank")
    if worker is not None or rank is not None:
        if worker is None or rank is None:
            raise InvalidRoutingMetadata(
                "x-base-worker-id" if worker is None else "x-target-dp-rank",
                "x-base-worker-id and x-target-dp-rank go together (both or neither)",
            )
        hint: InstanceId | None = InstanceId(
            parse_id("x-base-worker-id", worker), parse_rank("x-target-dp-rank", rank)
        )
    else:
        hint = _body_hint(body)
    return RoutingMeta(
        request_id=request_id,
        prompt_id=prompt_id,
        version_tag=version_tag,
        floor=floor,
        is_validate=flags["x-is-validate"],
        is_sticky=flags["x-is-sticky"],
        hint=hint,
        force_pin_once=flags["x-force-pin-once"],
    )
