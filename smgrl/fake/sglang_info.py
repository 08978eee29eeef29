"""SGLang's discovery documents: /server_info, /model_info, /v1/models, /v1/loads.

Top-level /server_info keys are the server args as launched (so ``weight_version`` there is
the startup value); ``internal_states`` carries the live values, one dict per DP rank.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

from smgrl.core.numbers import parse_uint
from smgrl.fake.http import Request, Response, json_response, text_response

if TYPE_CHECKING:
    from smgrl.fake.sglang import SGLangEngine

LOAD_SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues", "all")
_MAX_TOTAL_TOKENS = 500_000
_MAX_RUNNING = 2048


def max_model_len(engine: SGLangEngine) -> int:
    return engine.config.context_length or engine.checkpoint.max_model_len


def server_args(engine: SGLangEngine) -> dict[str, Any]:
    c = engine.config
    return {
        "model_path": engine.startup_model_path,
        "tokenizer_path": engine.startup_model_path,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "load_format": "auto",
        "trust_remote_code": False,
        "context_length": c.context_length,
        "is_embedding": False,
        "revision": None,
        "host": c.host,
        "port": engine.port,
        "dtype": "auto",
        "quantization": None,
        "kv_cache_dtype": "auto",
        "mem_fraction_static": 0.88,
        "max_running_requests": None,
        "max_total_tokens": None,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "schedule_policy": "fcfs",
        "page_size": 1,
        "device": "cuda",
        "tp_size": c.tp_size,
        "pp_size": c.pp_size,
        "dp_size": c.dp_size,
        "ep_size": c.ep_size,
        # SGLang derives attn_dp_size from DP attention: dp_size with it, 1 without (the fake
        # never enables it, see enable_dp_attention below).
        "attn_dp_size": 1,
        "moe_dp_size": 1,
        "nnodes": 1,
        "node_rank": 0,
        "stream_interval": c.stream_interval,
        "incremental_streaming_output": c.incremental_streaming_output,
        "random_seed": 42,
        "served_model_name": engine.startup_served_model_name,
        "weight_version": c.weight_version,
        "api_key": None,
        "admin_api_key": None,
        "load_balance_method": "round_robin",
        "enable_dp_attention": False,
        "disaggregation_mode": "null",
        "enable_memory_saver": False,
        "enable_weights_cpu_backup": c.enable_weights_cpu_backup,
        "attention_backend": None,
        "enable_metrics": False,
        "reasoning_parser": None,
        "tool_call_parser": None,
        "speculative_algorithm": None,
    }


def server_info(engine: SGLangEngine) -> dict[str, Any]:
    c = engine.config
    launch = f"python -m sglang.launch_server --model-path {engine.startup_model_path} --port {engine.port}"
    internal = [
        {
            **server_args(engine),
            "model_path": engine.model_path,
            "served_model_name": engine.served_model_name,
            "weight_version": engine.weight_version,
            "dp_rank": rank,
            "world_size": c.tp_size * c.pp_size,
            "max_running_requests": _MAX_RUNNING,
            "last_gen_throughput": 0.0,
            "memory_usage": {
                "weight": 1.2,
                "kvcache": 10.5,
                "token_capacity": _MAX_TOTAL_TOKENS,
                "graph": 0.4,
            },
        }
        for rank in range(c.dp_size)
    ]
    return {
        **server_args(engine),
        "launch_command": launch,
        "status": "ready",
        "max_total_num_tokens": _MAX_TOTAL_TOKENS,
        "max_req_input_len": max_model_len(engine) - 6,
        "startup_time": engine.created,
        "kv_events": None,
        "internal_states": internal,
        "version": engine.version,
        "frontend": "python",
    }


# Shaped like fake/tokenspeed_info.py's model_info_full: each engine's own field list, as that engine answers.
def model_info(engine: SGLangEngine) -> dict[str, Any]:
    return {
        "model_path": engine.model_path,
        "served_model_name": engine.served_model_name,
        "tokenizer_path": engine.startup_model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": engine.weight_version,
        "load_format": engine.load_format,
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": engine.checkpoint.model_type,
        "architectures": list(engine.checkpoint.architectures),
    }


def models_list(engine: SGLangEngine, card: str | None = None) -> Response:
    name = engine.served_model_name
    entry = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": max_model_len(engine),
    }
    if card is None:
        return json_response({"object": "list", "data": [entry]})
    if card == name:
        return json_response(entry)
    error = {
        "message": f"The model '{card}' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    return json_response({"error": error}, 404)


def loads(engine: SGLangEngine, req: Request) -> Response:
    include = {s.strip() for s in (req.arg("include") or "core").split(",") if s.strip()}
    bad = sorted(include - set(LOAD_SECTIONS))
    fmt = req.arg("format", "json")
    if bad or fmt not in ("json", "prometheus"):
        what = f"include value(s) {', '.join(bad)}" if bad else f"format {fmt!r}"
        message = f"Invalid {what}"
        return json_response(
            {"object": "error", "message": message, "type": "400", "param": None, "code": 400}, 400
        )
    if "all" in include:
        include = set(LOAD_SECTIONS)
    dp = engine.config.dp_size
    jobs = list(engine.scheduler.jobs.values())
    rows = []
    for rank in range(dp):
        mine = jobs[rank::dp]
        running = sum(1 for j in mine if not j.retracted)
        waiting = len(mine) - running
        used = sum(len(j.prompt_ids) + len(j.output_ids) for j in mine)
        row: dict[str, Any] = {
            "dp_rank": rank,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_reqs": running + waiting,
            "num_used_tokens": used,
            "max_total_num_tokens": _MAX_TOTAL_TOKENS,
            "token_usage": round(used / _MAX_TOTAL_TOKENS, 6),
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": round(running / _MAX_RUNNING, 6),
            "max_running_requests": _MAX_RUNNING,
        }
        if "memory" in include:
            row["memory"] = {
                "weight_gb": 1.2,
                "kv_cache_gb": 10.5,
                "graph_gb": 0.4,
                "token_capacity": _MAX_TOTAL_TOKENS,
            }
        if "spec" in include:
            row["speculative"] = None
        if "lora" in include:
            row["lora"] = {"num_loaded_adapters": 0}
        if "disagg" in include:
            row["disaggregation"] = {"mode": "null"}
        if "queues" in include:
            row["queues"] = {"waiting": waiting, "grammar": 0, "paused": len(mine) if engine.paused else 0,
                             "retracted": waiting}  # fmt: skip
        rows.append(row)
    wanted = req.arg("dp_rank")
    rank = parse_uint(wanted)
    if rank is not None:
        rows = [r for r in rows if r["dp_rank"] == rank]
    if fmt == "prometheus":
        lines = []
        for row in rows:
            for key in ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "token_usage"):
                lines.append(f'sglang:{key}{{dp_rank="{row["dp_rank"]}"}} {row[key]}')
        return text_response("\n".join(lines) + "\n")
    c = engine.config
    return json_response({
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": engine.version,
        "accelerator": "cuda",
        "num_accelerators": c.tp_size * c.pp_size * c.dp_size,
        "loads": rows,
    })  # fmt: skip
