"""The gateway's parts, wired together once (by ``smgrl.runtime.server`` or by a test).

Every service is built here, in one place (the data plane and the sessions too: ``smgrl.http.app`` only
mounts their ASGI fronts). Nothing here starts a task: ``Gateway`` only holds references.
``smgrl.runtime.server.serve`` owns the root nursery and starts the journal writer, the registry jobs, the
health checker and the HTTP listeners inside it.
"""

from __future__ import annotations

import attrs

from journal import EventStore, JournalWriter
from smgrl.control import ControlService, ControlWrites
from smgrl.core.auth import AuthPolicy
from smgrl.core.config import Config
from smgrl.core.ids import new_hex_id
from smgrl.dataplane import DataPlane, PinJournal
from smgrl.refit import RefitService
from smgrl.registry import KeyRing, LoadMonitor, RegistryService
from smgrl.runtime.tail import JournalTail
from smgrl.sessions import build as build_sessions
from smgrl.state import FleetState
from smgrl.telemetry.audit import AuditCounts
from smgrl.telemetry.metrics import Metrics
from smgrl.upstream import PoolSet


@attrs.define
class Gateway:
    cfg: Config
    fleet: FleetState
    journal: JournalWriter  # services see it as an Appender (smgrl.telemetry.journaling)
    store: EventStore  # the read side, for the journal routes
    keys: KeyRing
    pools: PoolSet
    metrics: Metrics
    auth: AuthPolicy
    registry: RegistryService
    control: ControlService
    audit: AuditCounts
    dataplane: DataPlane  # the rollout routes' service (served by smgrl/http/fronts/dataplane.py)
    # This gateway's id, sent on GET /health (``x-smgrl-gateway-id``): discovery refuses a worker
    # URL whose /health answers with it (the URL reaches this gateway, or another process
    # serving the same journal on a shared port). The journal's own id, so every process of one
    # journal shares it; a random one for a journal without an id (``:memory:``).
    instance_id: str = ""
    refits: RefitService | None = None
    writes: ControlWrites | None = None  # journal-only version/state/dispatch writes
    # Agent sessions (docs/sessions.md): None without --tokenizer-path (their routes answer 503).
    sessions: object | None = None  # smgrl.sessions.service.SessionService
    tail: JournalTail = attrs.Factory(JournalTail)  # GET /v1/rl/journal/stream, the fleet page
    # Several processes on one journal (smgrl/cluster/sharing.py); None for a lone gateway.
    sharing: object | None = None
    # ... and how requests for another process's session or refit reach it (smgrl/cluster/forwarding.py).
    forwarder: object | None = None
    # engine_load samples for GET /workers and /get_loads (smgrl/registry/loads.py; built by
    # build(), run by serve() in every process; in-process tests poll it by hand).
    loads: LoadMonitor | None = None

    @classmethod
    def build(
        cls, cfg: Config, *, fleet: FleetState, journal, store, keys: KeyRing, pools: PoolSet | None = None
    ) -> Gateway:
        pools = pools or PoolSet()
        metrics = Metrics(rl_enabled=cfg.rl.enabled)
        instance_id = _instance_id(store)
        registry = RegistryService(
            fleet=fleet, journal=journal, keys=keys, pools=pools, cfg=cfg, instance_id=instance_id
        )
        control = ControlService(
            fleet=fleet, journal=journal, pools=pools, keys=keys, rl=cfg.rl, metrics=metrics
        )
        auth = AuthPolicy.build(cfg.control_plane_keys, cfg.tenant_keys, cfg.api_key)
        audit = AuditCounts(cfg.audit_interval_secs)
        dataplane = DataPlane(cfg=cfg, fleet=fleet, pools=pools, keys=keys, registry=metrics.registry)
        if getattr(journal, "position", None) is not None:
            # Several processes on this journal: a prompt group's pin is decided once among them.
            dataplane.share_pins(PinJournal(journal, lambda: control.identity))
        gateway = cls(
            cfg,
            fleet,
            journal,
            store,
            keys,
            pools,
            metrics,
            auth,
            registry,
            control,
            audit,
            dataplane,
            instance_id,
        )
        gateway.refits = RefitService(fleet=fleet, journal=journal, control=control, cfg=cfg)
        gateway.writes = ControlWrites(fleet=fleet, journal=journal, control=control)
        gateway.sessions = build_sessions(gateway, dataplane)
        if gateway.sessions is not None and gateway.sessions.chat is not None:
            # gRPC engines take token ids: the gateway tokenizes text and chat, detokenizes answers.
            dataplane.grpc.tokenizer = gateway.sessions.chat
        # Without --tokenizer-path: the tokenizer each gRPC engine served at discovery (a process
        # that did not discover an engine fetches it on its first exchange with it).
        dataplane.grpc.engine_tokenizers.lookup = registry.tokenizers.chat_for
        gateway.loads = LoadMonitor(
            fleet=fleet,
            pools=pools,
            keys=keys,
            interval_secs=cfg.load_monitor_interval_secs,
            instance_id=instance_id,
        )
        # Every in-memory view is fed from the journal's commit path, in commit order, before the
        # appenders wake: the key ring (secrets), the projections, the registry's jobs, metrics.
        journal.on_secrets = keys.apply
        journal.on_commit = gateway.committed
        metrics.journal_lock_waits.set_function(lambda: getattr(journal, "lock_waits", 0))
        return gateway

    def committed(self, records) -> None:
        """A batch committed (called by the journal writer; an exception here stops the gateway)."""
        self.fleet.apply_records(records)
        self.registry.committed(records)
        self.metrics.journaled(records)
        self.tail.publish(records)  # last: subscribers see what the projections already hold


def _instance_id(store) -> str:
    meta = getattr(store, "meta", None)
    journal_id = meta().get("journal_id") if callable(meta) else None
    return journal_id or new_hex_id()
