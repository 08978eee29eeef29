"""What keeps a refit that goes wrong from taking the fleet down (docs/refits.md), mixed into
``smgrl.refit.saga.RefitService``:

- ``_check_checkpoint``: a disk refit's checkpoint missing on a fleet of this host is refused
  before anything is paused;
- ``_keep_refused``: an engine that refused its load and still serves its old weights (read
  back) is resumed on them, not quarantined;
- ``_confirmations``: the versions a saga read back and resumes engines on are confirmed in the
  engine projection (``engine.version_set``), so those engines are routable (a load cut short by
  a crash left them ``unconfirmed``; a refused load left them ``mixed``);
- ``listing``: ``GET /v1/rl/refits``.
"""

from __future__ import annotations

import os
from typing import Any

import trio

from smgrl.core import Worker, on_this_host
from smgrl.events import EngineVersionSet, RefitStepDone
from smgrl.refit import plan as P
from smgrl.refit.errors import CheckpointMissing
from smgrl.refit.request import RefitRequest
from smgrl.refit.results import result_of
from smgrl.state import EngineRun, Saga


class FailSafe:
    """Needs ``fleet`` and the saga runner's ``_calls`` and ``_append`` (``RefitService``)."""

    def listing(self, limit: int, state: str | None = None) -> list[dict[str, Any]]:
        """The sagas in memory (every open one, the last finished ones), newest first, each as a
        summary (no plan, engines counted by status); ``state``: only those in that state (or
        with that result)."""
        sagas = sorted(
            (*self.fleet.sagas.open.values(), *self.fleet.sagas.recent.values()),
            key=lambda saga: saga.started_seq,
            reverse=True,
        )
        out = []
        for saga in sagas:
            shown = saga.state if saga.result is None else saga.result
            if state is not None and shown != state:
                continue
            counts: dict[str, int] = {}
            for r in saga.engines.values():
                counts[r.status] = counts.get(r.status, 0) + 1
            out.append(
                {
                    "refit_id": saga.refit_id,
                    "state": shown,
                    "result": saga.result,
                    "detail": saga.detail,
                    "source": saga.source,
                    "model_path": saga.model_path,
                    "weight_version": saga.weight_version,
                    "on_failure": saga.on_failure,
                    "selector": saga.selector,
                    "engines": counts,
                    "quarantined": list(saga.quarantined),
                    "started_seq": saga.started_seq,
                    "last_seq": saga.last_seq,
                }
            )
            if len(out) >= limit:
                break
        return out

    @staticmethod
    async def _check_checkpoint(req: RefitRequest, targets: list[Worker]) -> None:
        """Before anything is paused: a disk refit's absolute checkpoint path must exist when
        every engine runs on this host (a typo would otherwise pause the whole fleet for loads
        that all fail). Engines elsewhere read another filesystem, and a relative path may be a
        hub model id: neither is checked here (the engines' refusals are, per engine)."""
        path = req.model_path
        if req.source != "disk" or not path or not os.path.isabs(path):
            return
        if not all(on_this_host(w.url) for w in targets):
            return
        # A stat, off the event loop: a hung network filesystem must not stall the gateway.
        if not await trio.Path(path).exists():
            raise CheckpointMissing(
                f"checkpoint `{path}` does not exist on this host, where every selected engine runs:"
                " nothing was paused",
                model_path=path,
            )

    def _confirmations(self, saga: Saga, seen: list[tuple[EngineRun, str]]) -> list:
        """``engine.version_set`` for the engines whose version the saga read back while the
        engine projection does not hold it as confirmed: the call that set it was cut short by a
        crash (its outcome unknown there), or the engine refused a load the rest of the fleet
        took (``mixed``). The saga resumes them on a version it has seen, so routing and
        discovery must see it too; without this they stay held out (``unconfirmed``, ``mixed``)
        for good. None in a run whose loads were all answered ok (nothing to confirm)."""
        by_version: dict[str, list[dict[str, str]]] = {}
        for r, version in seen:
            facts = self.fleet.engines.get(r.base_url)
            if (
                facts is not None
                and facts.weight_version == version
                and facts.version_known
                and not facts.mixed
            ):
                continue
            target = {"worker_id": r.worker_id, "url": r.url, "base_url": r.base_url}
            by_version.setdefault(version, []).append(target)
        return [
            EngineVersionSet(
                weight_version=version,
                targets=targets,
                selector=f"refit:{saga.refit_id}",
                principal=saga.principal,
            )
            for version, targets in by_version.items()
        ]

    async def _keep_refused(self, saga: Saga) -> None:
        """Engines that refused their load before touching their weights (the kind's load sets
        the weights and the version together and refuses before either: SGLang from disk) are
        asked their version: the one they had before the refit -> they still serve their old
        weights and are resumed on them (status ``refused``, the refusal reported). Any other
        answer leaves them failed (their weights unknown or changed: quarantined)."""
        runs = [
            r
            for r in saga.engines.values()
            if r.status == "failed"
            and r.phase == "load"
            and P.refusal_keeps_weights(r.kind, saga.source)
            and r.previous_version is not None
            and r.previous_version != saga.weight_version
        ]
        if not runs:
            return
        calls = {r.worker_id: P.readback_call(r.kind) for r in runs}
        seen = await self._calls(saga, "readback", runs, calls)
        kept = [
            {
                **result_of(
                    r,
                    "refused",
                    f"{r.detail or 'the load was refused'} (it still serves version "
                    f"`{r.previous_version}`, read back: resumed on it)",
                ),
                "version": r.previous_version,
            }
            for r, x in zip(runs, seen, strict=True)
            if x.get("version") == r.previous_version
        ]
        if kept:
            confirm = self._confirmations(saga, [(saga.engines[x["worker_id"]], x["version"]) for x in kept])
            await self._append(
                saga.refit_id,
                [RefitStepDone(refit_id=saga.refit_id, phase="load", results=kept), *confirm],
            )
