"""vLLM's documents and smaller routes: /v1/models, dev /server_info, /weight_checker, and the
token-in-token-out ``/inference/v1/generate`` (the one vLLM route that reports weight-version
spans; its exact payload is [inferred] from vLLM's source, not probed)."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from smgrl.fake.body import loose_json
from smgrl.fake.generate import run_jobs
from smgrl.fake.http import Request, Response, json_response
from smgrl.fake.limits import LimitError, check_tokens, max_tokens_arg
from smgrl.fake.scheduler import Job

if TYPE_CHECKING:
    from smgrl.fake.vllm import VLLMEngine


def max_model_len(engine: VLLMEngine) -> int:
    return engine.config.context_length or engine.checkpoint.max_model_len


def models_list(engine: VLLMEngine) -> dict[str, Any]:
    # Startup names on purpose: vLLM's /v1/models does not follow refits.
    now = int(time.time())
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": now,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": engine.startup_served_model_name,
        "object": "model",
        "created": now,
        "owned_by": "vllm",
        "root": engine.startup_model_path,
        "parent": None,
        "max_model_len": max_model_len(engine),
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def server_info(engine: VLLMEngine, config_format: str | None) -> dict[str, Any]:
    c = engine.config
    config = {
        "model_config": {"model": engine.startup_model_path, "served_model_name": engine.startup_served_model_name,
                         "max_model_len": max_model_len(engine)},
        "parallel_config": {"tensor_parallel_size": c.tp_size, "pipeline_parallel_size": c.pp_size,
                            "data_parallel_size": c.dp_size},
    }  # fmt: skip
    shown: Any = config if config_format == "json" else json.dumps(config)
    return {"vllm_config": shown, "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"}, "system_env": {}}


def weight_checker(engine: VLLMEngine, args: dict[str, Any]) -> Response:
    checksums = {"model": engine.weights_digest, **engine.transfers.checksums}
    action = args["action"]
    if action == "checksum":
        return json_response({"checksums": checksums})
    if action == "reset":
        return json_response({"status": "reset"})
    if action == "compare":
        baseline = args["baseline"]
        if baseline is None:
            return engine.openai_error(400, "compare needs a baseline", "BadRequestError")
        base = baseline.get("checksums", baseline)
        mismatches = sorted(k for k in set(base) | set(checksums) if base.get(k) != checksums.get(k))
        return json_response({"match": not mismatches, "mismatches": mismatches})
    return engine.openai_error(400, f"unknown action {action!r}", "BadRequestError")


async def inference_generate(engine: VLLMEngine, req: Request) -> Response:
    obj = loose_json(req.body)
    if not isinstance(obj, dict) or not isinstance(obj.get("token_ids"), list):
        return engine.openai_error(400, "token_ids (a list of ints) is required", "BadRequestError")
    params = obj.get("sampling_params") or {}
    if not isinstance(params, dict) or not all(isinstance(t, int) for t in obj["token_ids"]):
        return engine.openai_error(400, "token_ids (a list of ints) is required", "BadRequestError")
    try:
        asked = max_tokens_arg(params.get("max_tokens"), "max_tokens")
        check_tokens(engine, len(obj["token_ids"]), asked or 0)
    except LimitError as exc:
        return engine.openai_error(400, str(exc), "BadRequestError")
    stop = params.get("stop") or ()
    job = Job(
        rid=str(obj.get("request_id") or f"gen-{uuid.uuid4().hex}"),
        prompt_ids=list(obj["token_ids"]),
        max_new_tokens=asked or 16,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        ignore_eos=bool(params.get("ignore_eos", False)),
        seed=params.get("seed"),
    )
    engine.precheck_admission()
    await run_jobs(engine, [job])
    choice = {
        "index": 0,
        "token_ids": list(job.output_ids),
        "logprobs": list(job.output_logprobs) if params.get("logprobs") is not None else None,
        "finish_reason": job.finish["type"] if job.finish else None,
        "weight_versions": [{"version": v, "start": s, "end": e} for v, s, e in job.spans],
    }
    return json_response({"request_id": job.rid, "choices": [choice]})
