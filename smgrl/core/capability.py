"""What an engine can do for RL control: a static row per engine, overridable by ``rl.*`` labels.

docs/rl-control-plane.md, "Capabilities", mirroring SMG 1.13.0's ``crates/rl/src/capability.rs``. The six override labels are
the ones a TokenSpeed engine advertises in its server args (docs/tokenspeed.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from smgrl.core.selector import rust_trim

LIST_LABELS = ("rl.pause_modes", "rl.update_from")
BOOL_LABELS = ("rl.abort", "rl.flush_cache", "rl.sleep_wake", "rl.reports_weight_version")


def str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    """A tuple of strings (an attrs converter with a type mypy can read, unlike ``tuple``)."""
    return tuple(values)


@attrs.frozen
class Capabilities:
    source: str  # "static" (table row as is) or "label" (any rl.* label overrode it)
    pause_modes: tuple[str, ...] = attrs.field(converter=str_tuple)
    update_from: tuple[str, ...] = attrs.field(converter=str_tuple)
    abort: bool
    flush_cache: bool
    sleep_wake: bool
    reports_weight_version: bool

    def to_json(self) -> dict[str, Any]:
        """The wire object, keys in SMG's field order, lists as JSON arrays."""
        return {
            "source": self.source,
            "pause_modes": list(self.pause_modes),
            "update_from": list(self.update_from),
            "abort": self.abort,
            "flush_cache": self.flush_cache,
            "sleep_wake": self.sleep_wake,
            "reports_weight_version": self.reports_weight_version,
        }


_NONE = Capabilities("static", (), (), False, False, False, False)

STATIC_ROWS: Mapping[str, Capabilities] = {
    "sglang": Capabilities(
        "static", ("abort", "retract", "in_place"), ("disk", "tensor", "distributed"), True, True, True, True
    ),
    "vllm": Capabilities(
        "static", ("abort", "wait", "keep"), ("disk", "distributed"), False, False, True, False
    ),
    # Fallback for TokenSpeed builds that predate advertisement: `keep` is left out on purpose,
    # and only the trainer-driven NCCL refit exists (`update_weights_from_disk` answers 501).
    "tokenspeed": Capabilities("static", ("wait", "abort"), ("distributed",), True, True, True, True),
}


def static_capabilities(engine: str) -> Capabilities:
    """The built-in row for an engine name (``sglang``, ``vllm``, ``tokenspeed``); empty otherwise."""
    return STATIC_ROWS.get(engine, _NONE)


def _list_label(value: str) -> tuple[str, ...]:
    items = (rust_trim(item) for item in value.split(","))
    return tuple(item for item in items if item)


def _bool_label(value: str) -> bool:
    # Rust's `eq_ignore_ascii_case("true")`: "TRUE" is true; "yes", "1", "on" are false.
    trimmed = rust_trim(value)
    return trimmed.isascii() and trimmed.lower() == "true"


def capabilities_for(engine: str, labels: Mapping[str, str]) -> Capabilities:
    """The static row for ``engine`` with every present ``rl.*`` label applied on top.

    A present label always counts as an override (an empty list label gives ``[]``), and any
    override switches ``source`` to ``"label"``; keys not overridden keep the static values.
    """
    changes: dict[str, Any] = {}
    for key in LIST_LABELS:
        if key in labels:
            changes[key.removeprefix("rl.")] = _list_label(labels[key])
    for key in BOOL_LABELS:
        if key in labels:
            changes[key.removeprefix("rl.")] = _bool_label(labels[key])
    row = static_capabilities(engine)
    if not changes:
        return row
    return attrs.evolve(row, source="label", **changes)
