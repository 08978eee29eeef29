"""Builds journals for the CLI tests: registrations, refit cycles of three engine kinds, failures,
an operation cut short. Times come from a fake clock (one tick per batch), so nothing depends on
the wall clock."""

from __future__ import annotations

import itertools
import json

from journal import Append, SqliteStore
from smgrl.core.observe import intent_of
from smgrl.events import (
    AuditControlPlane,
    ControlFinished,
    ControlInterrupted,
    ControlOutcome,
    ControlStarted,
    GatewayStarted,
    WorkerDiscovered,
    WorkerRegistered,
)

SECRET = "sk-THE-WORKER-SECRET-0123456789"
T0 = 1_800_000_000.0


class Builder:
    """Appends to a SqliteStore with a clock that moves ``step`` seconds per batch."""

    def __init__(self, path, *, step: float = 0.01):
        self.store = SqliteStore.open(path)
        self.now = T0
        self.step = step
        self.store._clock = self._tick
        self.ops = itertools.count(1)

    def _tick(self) -> float:
        self.now += self.step
        return self.now

    def close(self) -> None:
        self.store.close()

    def add(self, stream: str, event, secrets=None):
        return self.store.append_batch([Append(stream, event, secrets)])[0]

    def wait(self, seconds: float) -> None:
        self.now += seconds

    def register(
        self, wid: str, url: str, *, key: str | None = None, labels=None, dp: list[str] | None = None
    ):
        self.add(
            f"worker:{wid}",
            WorkerRegistered(
                worker_id=wid,
                url=url,
                base_url=url,
                source="api",
                labels=labels or {},
                has_api_key=key is not None,
                dp_aware=dp is not None,
            ),
            secrets={wid: key} if key else None,
        )
        self.add(
            f"worker:{wid}",
            WorkerDiscovered(
                worker_id=wid,
                runtime="sglang",
                labels={"weight_version": "v0", "dp_size": str(len(dp or [1]))},
                model_id="m",
                dp_rank_ids=dp or [],
            ),
        )

    def op(
        self,
        path: str,
        targets: list[tuple[str, str]],
        body: dict | None = None,
        *,
        fail: dict[str, int] | None = None,
        timeout: set[str] | frozenset[str] = frozenset(),
        cut_after: int | None = None,
        kind: str = "fanout",
        selector: str | None = "engine=sglang",
    ) -> str:
        """A control operation; ``cut_after`` N: only N outcomes, no control.finished (a crash)."""
        op_id = f"0000{next(self.ops):04d}-op"
        raw = json.dumps(body).encode() if body is not None else b""
        self.add(
            f"op:{op_id}",
            ControlStarted(
                op_id=op_id,
                kind=kind,
                method="POST",
                path=path,
                selector=selector if kind == "fanout" else None,
                targets=[{"worker_id": w, "url": u, "control_url": u} for w, u in targets],
                intent=intent_of("POST", path, raw).to_json(),
                principal="trainer",
                **ControlStarted.body_fields(raw),
            ),
        )
        ok = 0
        for i, (wid, url) in enumerate(targets):
            if cut_after is not None and i >= cut_after:
                return op_id
            status = (fail or {}).get(wid, 200)
            error = "upstream_timeout" if wid in timeout else None
            if error is None and status < 300:
                ok += 1
            self.add(
                f"op:{op_id}",
                ControlOutcome(
                    op_id=op_id,
                    worker_id=wid,
                    url=url,
                    control_url=url,
                    status=None if error else status,
                    error=error,
                    message="timed out" if error else None,
                    latency_ms=5,
                    excerpt='{"success": true}',
                ),
            )
        total = len(targets)
        self.add(
            f"op:{op_id}",
            ControlFinished(
                op_id=op_id,
                result="ok" if ok == total else "partial",
                http_status=200 if ok == total else 207,
                total=total,
                succeeded=ok,
                failed=total - ok,
                latency_ms=20,
            ),
        )
        return op_id

    def audit(self, path: str) -> None:
        self.add(
            "audit",
            AuditControlPlane(
                principal="trainer",
                auth_method="bearer",
                method="POST",
                path=path,
                outcome="success",
                status=200,
            ),
        )


def fleet_journal(path) -> dict:
    """The standard journal of these tests; returns the ids the tests look for."""
    b = Builder(path)
    b.add("gateway", GatewayStarted(version="0.1.0", pid=1, config={"port": 1}))
    engines = [(f"w{i}", f"http://127.0.0.1:{31000 + i}") for i in range(4)]
    for i, (wid, url) in enumerate(engines):
        b.register(wid, url, key=SECRET if i == 0 else None, labels={"pool": "rollout"})
    ids: dict = {"engines": engines}
    # 1: SGLang disk refit, all fine
    b.op("pause_generation", engines, {})
    b.op("update_weights_from_disk", engines, {"model_path": "/ckpt/1", "weight_version": "step-1"})
    b.op("continue_generation", engines, {})
    b.audit("/v1/rl/continue_generation")
    b.wait(30)
    # 2: w2 refuses the update (HTTP 500): the cycle fails and w2 stays mixed
    b.op("pause_generation", engines, {})
    ids["failed_op"] = b.op(
        "update_weights_from_disk",
        engines,
        {"model_path": "/ckpt/2", "weight_version": "step-2"},
        fail={"w2": 500},
    )
    b.op("continue_generation", engines, {})
    b.wait(30)
    # 3: TokenSpeed-style distributed refit: group setup, three chunks, teardown, inside pause/continue
    b.op("pause_generation", engines, {})
    b.op("init_weights_update_group", engines, {"group_name": "g"})
    for chunk in range(3):
        body = {"names": [f"layer{chunk}"], "weight_version": "step-3" if chunk == 2 else None}
        b.op("update_weights_from_distributed", engines, {k: v for k, v in body.items() if v is not None})
    b.op("destroy_weights_update_group", engines, {"group_name": "g"})
    b.op("continue_generation", engines, {})
    b.wait(30)
    # 4: vLLM-style: pause / collective_rpc reload / update_weight_version / resume, per worker on w3
    b.op("pause", engines[3:], {}, kind="call")
    b.op("collective_rpc", engines[3:], {"method": "reload_weights"}, kind="call")
    b.op("update_weight_version", engines[3:], {"new_version": "step-4"}, kind="call")
    b.op("resume", engines[3:], {}, kind="call")
    b.wait(30)
    # 5: a refit cut short by a crash during the update (two outcomes recorded, then nothing)
    b.op("pause_generation", engines, {})
    ids["cut_op"] = b.op(
        "update_weights_from_disk",
        engines,
        {"model_path": "/ckpt/5", "weight_version": "step-5"},
        cut_after=2,
    )
    b.add(
        f"op:{ids['cut_op']}",
        ControlInterrupted(
            op_id=ids["cut_op"],
            reason="gateway_restart",
            recorded_targets=["w0", "w1"],
            missing_targets=["w2", "w3"],
        ),
    )
    b.add("gateway", GatewayStarted(version="0.1.0", pid=2, config={"port": 1}))
    ids["last_seq"] = b.store.last_seq()
    ids["end_ts"] = b.now
    b.close()
    return ids
