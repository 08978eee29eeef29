"""What an engine reports at registration, turned into registry labels (pure).

The rules are SMG 1.13.0's, observed black-box (docs/deviations.md lists where smgrl differs): which fields
become labels, how values are stringified, how vLLM is told apart, and the gRPC normalisation
TokenSpeed needs. The registry service does the HTTP; this module only decides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from smgrl.core.worker import parse_size

SERVER_INFO_KEYS = (
    "model_path",
    "tokenizer_path",
    "served_model_name",
    "tp_size",
    "dp_size",
    "pp_size",
    # Not in the spec's list, but SMG 1.13.0 labels it (black-box, smg-diff against SGLang 0.5.23).
    "attn_dp_size",
    "load_balance_method",
    "version",
    "weight_version",
    "is_embedding",
    "context_length",
    "enable_dp_attention",
    "max_running_requests",
)
MODEL_INFO_KEYS = (
    "has_image_understanding",
    "has_audio_understanding",
    "is_generation",
    "architectures",
    "model_type",
)
# gRPC server-info normalisation (docs/tokenspeed.md, "Registering"). Renames only fill a missing key: a real tp_size wins.
GRPC_RENAMES = (
    ("tensor_parallel_size", "tp_size"),
    ("attn_tp_size", "tp_size"),
    ("pipeline_parallel_size", "pp_size"),
    ("context_parallel_size", "cp_size"),
    ("data_parallel_size", "dp_size"),
    ("block_size", "page_size"),
)
GRPC_TRANSIENT = frozenset(
    {"active_requests", "is_paused", "last_receive_timestamp", "uptime_seconds", "server_type"}
)
RL_ADVERTISED = (
    "rl.control_url",
    "rl.pause_modes",
    "rl.update_from",
    "rl.abort",
    "rl.flush_cache",
    "rl.sleep_wake",
    "rl.reports_weight_version",
)


@attrs.frozen
class Discovery:
    runtime: str
    labels: dict[str, str]
    model_id: str | None
    dp_size: int | None


def label_value(value: Any) -> str | None:
    """Label values are strings: numbers stringified, booleans ``true``/``false``, arrays and
    objects compact JSON; null gives no label."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _first_model(models: Mapping[str, Any] | None) -> Mapping[str, Any]:
    data = (models or {}).get("data") if isinstance(models, Mapping) else None
    if isinstance(data, list) and data and isinstance(data[0], Mapping):
        return data[0]
    return {}


def is_vllm(models: Mapping[str, Any] | None) -> bool:
    return _first_model(models).get("owned_by") == "vllm"


def _put(labels: dict[str, str], key: str, value: Any) -> None:
    text = label_value(value)
    if text is not None:
        labels[key] = text


def sglang_labels(
    server_info: Mapping[str, Any] | None,
    model_info: Mapping[str, Any] | None,
    models: Mapping[str, Any] | None,
) -> Discovery:
    labels: dict[str, str] = {}
    for key in SERVER_INFO_KEYS:
        if server_info and key in server_info:
            _put(labels, key, server_info[key])
    for key in MODEL_INFO_KEYS:
        if model_info and key in model_info:
            _put(labels, key, model_info[key])
    card = _first_model(models)
    if "max_model_len" in card:
        _put(labels, "max_model_len", card["max_model_len"])
    if "served_model_name" not in labels and card.get("id"):
        _put(labels, "served_model_name", card["id"])
    if "model_path" not in labels and card.get("root"):
        _put(labels, "model_path", card["root"])
    return Discovery(
        runtime="sglang",
        labels=labels,
        model_id=labels.get("served_model_name") or labels.get("model_path"),
        dp_size=_routing_dp_size(labels),
    )


def _routing_dp_size(labels: Mapping[str, str]) -> int | None:
    """How many ``--dp-aware`` ranks SMG 1.13.0 makes of an SGLang engine: ``dp_size`` times
    ``attn_dp_size`` (1 when absent). Observed black-box: dp 2 -> 2 ranks, dp 2 + attn 2 -> 4,
    dp 3 + attn 2 -> 6, dp 1 + attn 3 -> 3. The ``dp_size`` label itself stays the engine's."""
    dp = parse_size(labels.get("dp_size"))
    attn = parse_size(labels.get("attn_dp_size"))
    if dp is None:
        return None
    return dp * (attn if attn is not None else 1)


def vllm_labels(models: Mapping[str, Any] | None, version: Mapping[str, Any] | None) -> Discovery:
    labels: dict[str, str] = {}
    card = _first_model(models)
    if "max_model_len" in card:
        _put(labels, "max_model_len", card["max_model_len"])
    if card.get("root"):
        _put(labels, "model_path", card["root"])
    if card.get("id"):
        _put(labels, "served_model_name", card["id"])
    if version and "version" in version:
        _put(labels, "version", version["version"])
    return Discovery(runtime="vllm", labels=labels, model_id=labels.get("served_model_name"), dp_size=None)


def grpc_labels(server_info: Mapping[str, Any] | None, runtime: str) -> Discovery:
    """Labels for a gRPC worker from its (SGLang-shaped, flattened) server info, as SMG builds
    them from the server-info RPC: renames, transient keys dropped, ``rl.*`` advertisement kept."""
    info = dict(server_info or {})
    nested = info.get("server_args")
    if isinstance(nested, Mapping):
        for k, v in nested.items():
            info.setdefault(k, v)
    for src, dst in GRPC_RENAMES:
        if src in info and dst not in info:
            info[dst] = info[src]
    labels: dict[str, str] = {}
    for key in (*SERVER_INFO_KEYS, *RL_ADVERTISED, "cp_size", "page_size"):
        if key in info and key not in GRPC_TRANSIENT:
            _put(labels, key, info[key])
    if "version" not in labels and info.get("tokenspeed_version") is not None:
        _put(labels, "version", info["tokenspeed_version"])
    return Discovery(
        runtime=runtime,
        labels=labels,
        model_id=labels.get("served_model_name") or labels.get("model_path"),
        dp_size=parse_size(labels.get("dp_size")),
    )
