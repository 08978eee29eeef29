"""The pure core: selectors, engine paths, versions, worker rows and ids, origins, escaping.

No I/O and no clock but where an id is made (``ids``). Every module is table-tested in
``tests/unit``; the names other packages use are listed here."""

from smgrl.core.aborts import ALL as CANCEL_ALL
from smgrl.core.aborts import aborts_inflight, cancelled_requests
from smgrl.core.control_url import control_url_for
from smgrl.core.discovery import Discovery, grpc_labels, is_vllm, sglang_labels, vllm_labels
from smgrl.core.ids import new_operation_id, new_worker_id, worker_id_problem
from smgrl.core.observe import PHASES, Intent, intent_of
from smgrl.core.origin import hostport, origin_key, origin_of
from smgrl.core.path import EnginePathError, metric_op, passthrough_query, validate_engine_path
from smgrl.core.printable import escape, escape_for_json, escape_lines
from smgrl.core.redact import redact_answer, redact_doc
from smgrl.core.selector import Selector, SelectorError, parse_selector, rust_trim
from smgrl.core.version import (
    MalformedVersion,
    Version,
    fleet_max,
    label_version,
    parse_u64,
    validate_version,
)
from smgrl.core.view import (
    RL_WORKER_ENTRY_FIELDS,
    EngineFacts,
    collapse,
    control_url,
    dp_ranks_for,
    facts_for,
    row,
    selector_view,
    workers_response,
)
from smgrl.core.worker import (
    WORKER_TYPES,
    Worker,
    connection_mode_for,
    on_this_host,
    parse_size,
    reaches_listener,
    redact_url,
    self_registration,
    strip_rank,
    worker_url_problem,
)

__all__ = [
    "CANCEL_ALL",
    "PHASES",
    "RL_WORKER_ENTRY_FIELDS",
    "WORKER_TYPES",
    "Discovery",
    "EngineFacts",
    "EnginePathError",
    "Intent",
    "MalformedVersion",
    "Selector",
    "SelectorError",
    "Version",
    "Worker",
    "aborts_inflight",
    "cancelled_requests",
    "collapse",
    "connection_mode_for",
    "control_url",
    "control_url_for",
    "dp_ranks_for",
    "escape",
    "escape_for_json",
    "escape_lines",
    "facts_for",
    "fleet_max",
    "grpc_labels",
    "hostport",
    "intent_of",
    "is_vllm",
    "label_version",
    "metric_op",
    "new_operation_id",
    "new_worker_id",
    "on_this_host",
    "origin_key",
    "origin_of",
    "parse_selector",
    "parse_size",
    "parse_u64",
    "passthrough_query",
    "reaches_listener",
    "redact_answer",
    "redact_doc",
    "redact_url",
    "row",
    "rust_trim",
    "selector_view",
    "self_registration",
    "sglang_labels",
    "strip_rank",
    "validate_engine_path",
    "validate_version",
    "vllm_labels",
    "worker_id_problem",
    "worker_url_problem",
    "workers_response",
]
