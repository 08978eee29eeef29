"""The refit plan per engine kind: which native calls, in what order (pure, no I/O).

A refit is a fixed sequence of neutral phases; each engine kind maps a phase to zero or more
native calls (docs/engines.md, "One refit, engine by engine"). Phases with no call for a kind are skipped for
that engine. The saga runner (``smgrl.refit.saga``) runs one phase across the whole fleet before
the next, so a failed load is known for every engine before any engine resumes.

Disk source:        pause -> load -> version -> flush -> verify -> resume
Distributed source: pause -> init -> begin -> [awaiting_transfer] -> end -> version -> flush
                    -> verify -> checksum -> destroy -> resume

``checksum`` runs only when the trainer passed ``source.distributed.checksums`` and only on kinds
with a per-tensor weight-checksum route (vLLM ``POST /weight_checker {"action": "checksum"}``);
the others are recorded ``unverified`` (SGLang's ``/weights_checker`` hashes all weights into one
value per engine, TokenSpeed has no such route).

Default pause modes keep the work in flight (docs/refits.md):

- SGLang ``retract``: running requests go back to the queue and are recomputed after
  ``continue_generation`` under the new weights; the cache may be flushed while paused
  (``in_place`` keeps KV, but then a flush is refused; ``abort`` drops the work).
- vLLM ``keep``: requests are frozen where they are; the flush uses
  ``reset_prefix_cache?reset_running_requests=true`` so the running ones are recomputed.
- TokenSpeed ``keep``: frozen in place (its own default ``wait`` blocks until they finish).

Publishing a version never aborts in-flight generation unless asked: SGLang's
``update_weight_version`` aborts by default, so the plan always sends ``abort_all_requests``
(false unless the pause mode is ``abort``); disk loads send ``abort_all_requests: false`` too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

KINDS = ("sglang", "vllm", "tokenspeed")
SOURCES = ("disk", "distributed")
DISK_PHASES = ("pause", "load", "version", "flush", "verify", "resume")
DIST_PHASES = ("pause", "init", "begin", "end", "version", "flush", "verify", "checksum", "destroy", "resume")
# The phase after which a distributed refit waits for the trainer's transfer.
TRANSFER_AFTER = "begin"
# A load (or the transfer's end) changes the weights: from then on the engine's weights are
# only known from its answers, and a missing answer means unknown weights.
WEIGHT_PHASES = frozenset({"load", "end"})

PAUSE_MODES: dict[str, tuple[str, ...]] = {
    "sglang": ("retract", "in_place", "abort"),
    "vllm": ("keep", "wait", "abort"),
    "tokenspeed": ("keep", "wait", "abort"),
}
DEFAULT_PAUSE_MODE = {"sglang": "retract", "vllm": "keep", "tokenspeed": "keep"}
ABORTING = frozenset({"abort"})
DEFAULT_GROUP = "weight_update_group"


@attrs.frozen
class Call:
    """One native call: ``method /path?query`` with a JSON body (None = no body)."""

    method: str
    path: str  # no leading slash
    query: str | None = None
    body: Mapping[str, Any] | None = None
    # How to read the answer: "success" (2xx and no ``success: false``), "version" (a read-back
    # of the weight version, from ``version_field``), "checksum" (per-tensor checksums to compare
    # with the trainer's, ``checksum_mismatches``).
    check: str = "success"
    version_field: str | None = None

    def body_bytes(self) -> bytes:
        if self.body is None:
            return b""
        return json.dumps(dict(self.body), separators=(",", ":"), sort_keys=True).encode()

    def to_json(self) -> dict[str, Any]:
        target = f"/{self.path}?{self.query}" if self.query else f"/{self.path}"
        return {
            "method": self.method,
            "target": target,
            "body": None if self.body is None else dict(self.body),
        }


@attrs.frozen
class DistributedSource:
    master_address: str
    master_port: int
    group_name: str = DEFAULT_GROUP
    backend: str = "nccl"
    checksums: Mapping[str, str] | None = None


@attrs.frozen
class EnginePlan:
    kind: str
    pause_mode: str
    # (phase, calls) in order; phases without calls for this kind are left out.
    steps: tuple[tuple[str, tuple[Call, ...]], ...]
    # True when ``verify`` reads the version from a route other than the one that set it.
    verifiable: bool
    # With trainer checksums: "checked" (a ``checksum`` phase compares them) or "unverified"
    # (the kind has no per-tensor checksum route); None without checksums.
    checksums: str | None = None

    def calls(self, phase: str) -> tuple[Call, ...]:
        for name, calls in self.steps:
            if name == phase:
                return calls
        return ()

    @property
    def phases(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pause_mode": self.pause_mode,
            "verifiable": self.verifiable,
            "checksums": self.checksums,
            "steps": [{"phase": p, "calls": [c.to_json() for c in calls]} for p, calls in self.steps],
        }


class Refused(ValueError):
    """This engine kind cannot take this refit (``reason`` is a stable code)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def phases_for(source: str) -> tuple[str, ...]:
    return DISK_PHASES if source == "disk" else DIST_PHASES


def refusal(kind: str, source: str, pause_mode: str | None) -> Refused | None:
    """Why ``kind`` cannot take this refit, or None."""
    if kind not in KINDS:
        return Refused("unsupported_engine", f"engine kind `{kind}` has no refit plan")
    if kind == "tokenspeed" and source == "disk":
        return Refused("unsupported_source", "TokenSpeed cannot load weights from disk (501)")
    if pause_mode is not None and pause_mode not in PAUSE_MODES[kind]:
        allowed = ", ".join(PAUSE_MODES[kind])
        return Refused("unsupported_pause_mode", f"{kind} has no pause mode `{pause_mode}` ({allowed})")
    return None


def version_call(kind: str, version: str, abort: bool) -> Call:
    if kind == "sglang":
        # SGLang aborts every request in flight unless told not to (docs/engines.md, checklist 5).
        return Call(
            "POST", "update_weight_version", body={"new_version": version, "abort_all_requests": abort}
        )
    return Call("POST", "update_weight_version", body={"new_version": version})


def refusal_keeps_weights(kind: str, source: str) -> bool:
    """Whether a refused load leaves the engine on its old weights, provably: the load sets the
    weights and the version in one call and refuses before touching either (SGLang from disk
    answers ``success: false`` before it replaces a tensor), so reading the version back tells.
    vLLM's reload sets no version (a failed one may have replaced some weights) and a
    distributed transfer sets the version only at its end: there a refusal leaves them unknown."""
    return source == "disk" and kind == "sglang"


def readback_call(kind: str) -> Call:
    """The version read from a route other than the one that set it."""
    if kind == "sglang":
        return Call("GET", "model_info", check="version", version_field="weight_version")
    if kind == "vllm":
        return Call("GET", "weight_info", check="version", version_field="weight_version")
    return Call("GET", "get_weight_version", check="version", version_field="weight_version")


def pause_call(kind: str, mode: str) -> Call:
    if kind == "vllm":
        return Call("POST", "pause", query=f"mode={mode}")
    return Call("POST", "pause_generation", body={"mode": mode})


def resume_call(kind: str) -> Call:
    if kind == "vllm":
        return Call("POST", "resume")
    return Call("POST", "continue_generation", body={})


def flush_call(kind: str) -> Call:
    if kind == "vllm":
        return Call("POST", "reset_prefix_cache", query="reset_running_requests=true")
    return Call("GET", "flush_cache")


def load_call(kind: str, model_path: str, version: str, abort: bool) -> Call:
    if kind == "sglang":
        return Call(
            "POST",
            "update_weights_from_disk",
            body={
                "model_path": model_path,
                "weight_version": version,
                "flush_cache": False,  # flushed in its own phase, so a refused flush is told apart
                "abort_all_requests": abort,
            },
        )
    return Call(
        "POST", "collective_rpc", body={"method": "reload_weights", "kwargs": {"weights_path": model_path}}
    )


def plan(
    kind: str,
    source: str,
    version: str,
    *,
    model_path: str | None = None,
    dist: DistributedSource | None = None,
    rank_offset: int = 1,
    world_size: int = 2,
    pause_mode: str | None = None,
    flush: bool = True,
) -> EnginePlan:
    """The engine's native calls for this refit (raises :class:`Refused`)."""
    refused = refusal(kind, source, pause_mode)
    if refused is not None:
        raise refused
    mode = pause_mode or DEFAULT_PAUSE_MODE[kind]
    abort = mode in ABORTING
    steps: list[tuple[str, tuple[Call, ...]]] = [("pause", (pause_call(kind, mode),))]
    if source == "disk":
        if model_path is None:
            raise ValueError("a disk refit needs a model path")
        steps.append(("load", (load_call(kind, model_path, version, abort),)))
        if kind == "vllm":
            steps.append(("version", (version_call(kind, version, abort),)))
    else:
        if dist is None:
            raise ValueError("a distributed refit needs its source")
        steps += _distributed(kind, version, dist, rank_offset, world_size, abort)
    if flush:
        steps.append(("flush", (flush_call(kind),)))
    steps.append(("verify", (readback_call(kind),)))
    checksums = None
    if source == "distributed":
        if dist is not None and dist.checksums:  # type: ignore[union-attr]
            checker = checksum_call(kind)
            checksums = "unverified" if checker is None else "checked"
            if checker is not None:
                steps.append(("checksum", (checker,)))
        steps.append(("destroy", (_destroy_call(kind, dist),)))  # type: ignore[arg-type]
    steps.append(("resume", (resume_call(kind),)))
    return EnginePlan(kind, mode, tuple(steps), verifiable=True, checksums=checksums)


def checksum_call(kind: str) -> Call | None:
    """The kind's per-tensor weight-checksum route, or None (docs/engines.md, vLLM: dev mode's
    ``/weight_checker``; SGLang's ``/weights_checker`` returns one hash of all weights per engine,
    which a trainer's per-tensor checksums cannot be compared with; TokenSpeed has none)."""
    if kind == "vllm":
        return Call("POST", "weight_checker", body={"action": "checksum"}, check="checksum")
    return None


def checksum_mismatches(expected: Mapping[str, str], body: Any) -> list[str] | None:
    """Names whose checksum the engine reports differently (or not at all); None when the answer
    holds no ``checksums`` object."""
    got = body.get("checksums") if isinstance(body, dict) else None
    if not isinstance(got, dict):
        return None
    return sorted(name for name, want in expected.items() if str(got.get(name)) != want)


def _distributed(
    kind: str, version: str, dist: DistributedSource, rank_offset: int, world_size: int, abort: bool
) -> list[tuple[str, tuple[Call, ...]]]:
    info = {
        "master_address": dist.master_address,
        "master_port": dist.master_port,
        "rank_offset": rank_offset,
        "world_size": world_size,
    }
    if kind == "vllm":
        return [
            ("init", (Call("POST", "init_weight_transfer_engine", body={"init_info": info}),)),
            ("begin", (Call("POST", "start_weight_update", body={}),)),
            ("end", (Call("POST", "finish_weight_update", body={"weight_version": version}),)),
        ]
    init = Call(
        "POST",
        "init_weights_update_group",
        body={**info, "group_name": dist.group_name, "backend": dist.backend},
    )
    steps: list[tuple[str, tuple[Call, ...]]] = [("init", (init,))]
    if kind == "sglang":
        steps.append(("begin", (Call("POST", "begin_weight_update", body={}),)))
        steps.append(("end", (Call("POST", "end_weight_update", body={}),)))
    steps.append(("version", (version_call(kind, version, abort),)))
    return steps


def _destroy_call(kind: str, dist: DistributedSource) -> Call:
    if kind == "vllm":
        return Call("POST", "shutdown_weight_transfer_engine", body={})
    return Call("POST", "destroy_weights_update_group", body={"group_name": dist.group_name})


def transfer_call(kind: str, dist: DistributedSource, names, dtypes, shapes) -> Call:
    """The engine's half of one broadcast chunk (the trainer sends the tensors at the same time)."""
    if kind == "vllm":
        return Call(
            "POST",
            "update_weights",
            body={"update_info": {"names": list(names), "dtype_names": list(dtypes), "shapes": list(shapes)}},
        )
    return Call(
        "POST",
        "update_weights_from_distributed",
        body={
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": list(shapes),
            "group_name": dist.group_name,
            "flush_cache": False,
            "abort_all_requests": False,
        },
    )


def rank_offsets(tp_sizes: list[int | None]) -> tuple[list[int], int]:
    """Rank offsets per engine (the trainer is rank 0) and the group's world size."""
    offsets, nxt = [], 1
    for tp in tp_sizes:
        offsets.append(nxt)
        nxt += tp or 1
    return offsets, nxt


def answer_ok(call: Call, status: int | None, body: Any) -> bool:
    """Did the engine take the call? 2xx, and no ``success: false`` (vLLM's prefix-cache reset
    answers 200 with it)."""
    if status is None or not 200 <= status < 300:
        return False
    return not (isinstance(body, dict) and body.get("success") is False)


def readback(call: Call, status: int | None, body: Any) -> str | None:
    """The version a read-back call reported, or None."""
    if not answer_ok(call, status, body) or not isinstance(body, dict) or call.version_field is None:
        return None
    value = body.get(call.version_field)
    return None if value is None else str(value)
