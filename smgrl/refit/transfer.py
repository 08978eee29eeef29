"""A distributed refit's trainer hand-off (docs/refits.md): the saga waits, at most the refit's
transfer timeout, for the trainer's ``commit`` or ``fail``; meanwhile each broadcast chunk's engine
half (``transfer_chunk``) runs as one call per engine. Only the process driving the saga holds the
hand-off; elsewhere (its driver died, a restart resumes it) the trainer is told to retry."""

from __future__ import annotations

import time
from typing import Any

import attrs
import trio

from smgrl.events import RefitState, RefitStepDone
from smgrl.refit import plan as P
from smgrl.refit.errors import RefitDriverUnavailable, RefitWrongState
from smgrl.refit.results import result_of
from smgrl.state import Saga


@attrs.define(eq=False)
class Transfer:
    """A distributed refit waiting for its trainer: set by commit/fail."""

    decided: trio.Event = attrs.Factory(trio.Event)
    verdict: str | None = None  # commit | fail
    detail: str | None = None


class TrainerTransfer:
    """Mixed into ``RefitService``: needs ``_transfers``, ``get`` and the phase runner's
    ``_members``, ``_calls`` and ``_append``."""

    async def commit(self, refit_id: str) -> None:
        await self._decide(refit_id, "commit", None)

    async def fail(self, refit_id: str, detail: str | None) -> None:
        await self._decide(refit_id, "fail", detail or "the trainer reported a failed transfer")

    def _driven_here(self, saga: Saga, transfer: Transfer | None) -> None:
        """A trainer's hand-off for an open saga that nobody drives right now (its driver died and
        is being replaced, or a restart resumes it): retryable, 503 ``refit_driver_unavailable``."""
        waiting = saga.state == "recovering" or (saga.state == "awaiting_transfer" and transfer is None)
        if saga.is_open and waiting:
            raise RefitDriverUnavailable(
                f"refit `{saga.refit_id}` is being resumed by a gateway process (its driver stopped):"
                " retry this call in a moment (docs/scale-out.md)",
                state=saga.state,
            )

    async def _decide(self, refit_id: str, verdict: str, detail: str | None) -> None:
        saga = self.get(refit_id)
        transfer = self._transfers.get(refit_id)
        # Idempotent: a trainer retrying its commit (or fail) whose first answer was lost (its
        # driver died after deciding, a connection broke) is told it was taken.
        if saga.transfer_verdict == verdict or (transfer is not None and transfer.verdict == verdict):
            return
        self._driven_here(saga, transfer)
        if not saga.is_open or saga.state != "awaiting_transfer" or transfer is None:
            raise RefitWrongState(
                f"refit `{refit_id}` is not awaiting a transfer (state `{saga.to_json()['state']}`)",
                state=saga.to_json()["state"],
            )
        if transfer.decided.is_set():
            raise RefitWrongState(f"refit `{refit_id}` was already {transfer.verdict}ed", state=saga.state)
        transfer.verdict, transfer.detail = verdict, detail
        transfer.decided.set()

    async def transfer_chunk(self, refit_id: str, names, dtypes, shapes) -> dict[str, Any]:
        """The engines' half of one broadcast chunk (the trainer sends the tensors meanwhile):
        each engine gets its kind's update call; the answer lists per-engine results."""
        saga = self.get(refit_id)
        self._driven_here(saga, self._transfers.get(refit_id))
        if saga.state != "awaiting_transfer" or not saga.is_open:
            raise RefitWrongState(
                f"refit `{refit_id}` is not awaiting a transfer", state=saga.to_json()["state"]
            )
        dist = dist_of(saga)
        runs = self._members(saga, "transfer")
        calls = {r.worker_id: P.transfer_call(r.kind, dist, names, dtypes, shapes) for r in runs}
        results = await self._calls(saga, "transfer", runs, calls)
        return {"results": results}

    async def _await_transfer(self, saga: Saga) -> None:
        """Wait for the trainer's commit or fail, at most the refit's transfer timeout."""
        transfer = self._transfers.setdefault(saga.refit_id, Transfer())
        await self._append(saga.refit_id, [RefitState(refit_id=saga.refit_id, state="awaiting_transfer")])
        timeout = saga.transfer_timeout_secs or 600.0
        # Resumed (a restart, or another process after the driver died): what is left of the
        # timeout since the saga first awaited its trainer (journal time, a wall clock).
        waited = time.time() - saga.awaiting_since if saga.awaiting_since is not None else 0.0
        with trio.move_on_after(max(0.0, timeout - max(0.0, waited))):
            await transfer.decided.wait()
        if transfer.verdict == "commit":
            done = [result_of(r, "ok", None) for r in saga.engines.values() if r.status in ("pending", "ok")]
            await self._append(
                saga.refit_id,
                [
                    RefitState(refit_id=saga.refit_id, state="committing"),
                    RefitStepDone(refit_id=saga.refit_id, phase="transfer", results=done),
                ],
            )
            return
        detail = transfer.detail or f"the transfer did not commit within {timeout:g}s"
        # The engines may hold part of the new weights: unknown, never resumed as they are.
        results = [
            result_of(r, "unknown", detail) for r in saga.engines.values() if r.status in ("pending", "ok")
        ]
        await self._append(
            saga.refit_id,
            [
                RefitState(refit_id=saga.refit_id, state="transfer_failed", detail=detail),
                RefitStepDone(refit_id=saga.refit_id, phase="transfer", results=results),
            ],
        )


def dist_json(dist: P.DistributedSource | None) -> dict[str, Any] | None:
    if dist is None:
        return None
    return {
        "master_address": dist.master_address,
        "master_port": dist.master_port,
        "group_name": dist.group_name,
        "backend": dist.backend,
        "checksums": dict(dist.checksums) if dist.checksums else None,
    }


def dist_of(saga: Saga) -> P.DistributedSource:
    d = saga.distributed or {}
    return P.DistributedSource(
        d.get("master_address", ""),
        int(d.get("master_port") or 0),
        d.get("group_name") or P.DEFAULT_GROUP,
        d.get("backend") or "nccl",
    )
