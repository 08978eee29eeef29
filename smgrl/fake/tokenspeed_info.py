"""TokenSpeed's sidecar discovery documents (docs/engines.md, TokenSpeed; docs/tokenspeed.md).

``/get_server_info`` is GetServerInfo flattened: the ``server_args`` keys copied to the top
level (and kept nested), the ``rl.*`` capability advertisement, plus ``scheduler_info``,
``active_requests``, ``is_paused``, ``uptime_seconds``, ``tokenspeed_version``, ``start_time``
and ``max_total_num_tokens``. The control API key is never shown.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smgrl.fake.tokenspeed import TokenSpeedEngine

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
_MAX_TOTAL_TOKENS = 500_000


def rl_advertisement(engine: TokenSpeedEngine) -> dict[str, str]:
    labels = {}
    host = engine.config.advertised_host or engine.config.host
    if host not in WILDCARD_HOSTS:
        shown = f"[{host}]" if ":" in host else host
        labels["rl.control_url"] = f"http://{shown}:{engine.port}"
    labels.update({
        "rl.pause_modes": "wait,abort,keep",
        "rl.update_from": "distributed",
        "rl.abort": "true",
        "rl.flush_cache": "true",
        "rl.sleep_wake": "true",
        "rl.reports_weight_version": "true",
    })  # fmt: skip
    return labels


def server_args(engine: TokenSpeedEngine) -> dict[str, Any]:
    c = engine.config
    return {
        "model_path": engine.model_path,
        "tokenizer_path": engine.startup_model_path,
        "served_model_name": engine.served_model_name,
        "attn_tp_size": c.tp_size,
        "dp_size": c.dp_size,
        "pp_size": c.pp_size,
        "ep_size": c.ep_size,
        "host": c.host,
        "port": engine.port,
        "weight_version": engine.weight_version,
        "context_length": c.context_length,
        "is_embedding": False,
        "disaggregation_mode": "null",
        **rl_advertisement(engine),
    }


def server_info(engine: TokenSpeedEngine) -> dict[str, Any]:
    args = server_args(engine)
    running = engine.scheduler.running()
    return {
        **args,
        "server_args": args,
        "scheduler_info": {"max_total_num_tokens": _MAX_TOTAL_TOKENS, "max_running_requests": 2048},
        "active_requests": len(engine.scheduler.jobs),
        "num_running_requests": len(running),
        "is_paused": engine.paused is not None,
        "uptime_seconds": round(time.time() - engine.start_time, 3),
        "tokenspeed_version": engine.version,
        "start_time": engine.start_time,
        "max_total_num_tokens": _MAX_TOTAL_TOKENS,
    }


# Shaped like fake/sglang_info.py's model_info: each engine's own field list, as that engine answers.
def model_info_full(engine: TokenSpeedEngine) -> dict[str, Any]:
    return {
        "model_path": engine.model_path,
        "served_model_name": engine.served_model_name,
        "tokenizer_path": engine.startup_model_path,
        "is_generation": True,
        "weight_version": engine.weight_version,
        "model_type": engine.checkpoint.model_type,
        "architectures": list(engine.checkpoint.architectures),
        "max_context_length": engine.config.context_length or engine.checkpoint.max_model_len,
    }


def models_list(engine: TokenSpeedEngine) -> dict[str, Any]:
    card = {
        "id": engine.served_model_name,
        "object": "model",
        "created": int(engine.start_time),
        "owned_by": "tokenspeed",
        "root": engine.served_model_name,
        "parent": None,
        "max_model_len": engine.config.context_length or engine.checkpoint.max_model_len,
    }
    return {"object": "list", "data": [card]}
