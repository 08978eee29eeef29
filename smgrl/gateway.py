"""The gateway's parts, wired together once (by ``smgrl.server`` or by a test).

Nothing here starts a task: ``Gateway`` only holds references. ``smgrl.server.serve`` owns the
root nursery and starts the journal writer, the registry jobs, the health checker and the HTTP
listeners inside it.
"""

from __future__ import annotations

import attrs

from smgrl.audit import AuditCounts
from smgrl.auth import AuthPolicy
from smgrl.config import Config
from smgrl.control.service import ControlService
from smgrl.metrics import Metrics
from smgrl.registry.keys import KeyRing
from smgrl.registry.service import RegistryService
from smgrl.state.fleet import FleetState
from smgrl.upstream import PoolSet


@attrs.define
class Gateway:
    cfg: Config
    fleet: FleetState
    journal: object  # journal.JournalWriter (or any Appender)
    store: object  # journal.SqliteStore / MemoryStore: read side for the journal routes
    keys: KeyRing
    pools: PoolSet
    metrics: Metrics
    auth: AuthPolicy
    registry: RegistryService
    control: ControlService
    audit: AuditCounts

    @classmethod
    def build(
        cls, cfg: Config, *, fleet: FleetState, journal, store, keys: KeyRing, pools: PoolSet | None = None
    ) -> Gateway:
        pools = pools or PoolSet()
        metrics = Metrics(rl_enabled=cfg.rl.enabled)
        registry = RegistryService(fleet=fleet, journal=journal, keys=keys, pools=pools, cfg=cfg)
        control = ControlService(
            fleet=fleet, journal=journal, pools=pools, keys=keys, rl=cfg.rl, metrics=metrics
        )
        auth = AuthPolicy.build(cfg.control_plane_keys, cfg.tenant_keys, cfg.api_key)
        audit = AuditCounts(cfg.audit_interval_secs)
        gw = cls(cfg, fleet, journal, store, keys, pools, metrics, auth, registry, control, audit)
        # Every in-memory view is fed from the journal's commit path, in commit order, before the
        # appenders wake: the key ring (secrets), the projections, the registry's jobs, metrics.
        journal.on_secrets = keys.apply
        journal.on_commit = gw.committed
        metrics.journal_lock_waits.set_function(lambda: getattr(journal, "lock_waits", 0))
        return gw

    def committed(self, records) -> None:
        """A batch committed (called by the journal writer; an exception here stops the gateway)."""
        self.fleet.apply_records(records)
        self.registry.committed(records)
        self.metrics.journaled(records)
