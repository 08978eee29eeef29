"""A fake engine's gRPC face, served by grpcio, as ``smg-grpc-servicer`` 0.14.1 answers.

The engine (its model, weights, versions, pause and abort, DP ranks, latency knobs) is the
HTTP fake's own, on trio; this front is a grpcio server in worker threads beside it, each
handler calling into the engine's trio loop (``trio.from_thread``). The control routes stay on
the engine's HTTP port (the ``rl.control_url`` of the registration). Wires: ``sglang``,
``vllm`` (upstream), ``vllm-psrl`` (PSRL's fork: other field numbers, no GetLoads) and
``tokenspeed`` (each chunk names its weight version).

Generate: one chunk per decode step when ``stream`` (the step's new token ids), then the
``Complete`` frame (all output ids, ``finish_reason`` "stop" / "length" / "abort",
``matched_token_id`` / ``matched_stop_str``); without ``stream`` only the ``Complete``.
An aborted request (Abort RPC, pause with abort, control abort) ends with a ``Complete`` whose
finish reason is "abort", as the servicers end a caller's abort. A cancelled stream leaves the
scheduler at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import queue
import uuid
import zipfile
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import trio
from smg_grpc_proto.generated import common_pb2

from smgrl.fake.scheduler import Job
from smgrl.upstream import WIRES, Wire

if TYPE_CHECKING:
    from smgrl.fake.base import BaseEngine

CHUNK_SIZE = 64 * 1024
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
)
TOKENIZER_GLOBS = ("*.jinja", "*.tiktoken", "*.model")
_END = object()


def wire_of(kind: str, psrl: bool = False) -> Wire:
    if kind == "vllm":
        return WIRES["vllm-psrl" if psrl else "vllm"]
    return WIRES[kind]


def tokenizer_bundle(directory: str, fallback: dict[str, Any] | None = None) -> tuple[bytes, str]:
    """The servicers' zip of a tokenizer directory and its sha256. A fake checkpoint has no
    tokenizer files (the fake model has its own vocabulary): ``fallback`` is then zipped as
    the bundle's ``tokenizer_config.json``."""
    buf = io.BytesIO()
    added = 0
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in TOKENIZER_FILES:
            path = Path(directory) / name
            if path.is_file():
                zf.write(path, name)
                added += 1
        for pattern in TOKENIZER_GLOBS:  # then the globbed ones (a chat_template.jinja) not yet in
            for path in sorted(Path(directory).glob(pattern)):
                if path.is_file() and path.name not in TOKENIZER_FILES:
                    zf.write(path, path.name)
                    added += 1
        if not added and fallback is not None:
            zf.writestr("tokenizer_config.json", json.dumps(fallback, sort_keys=True))
            added = 1
    if not added:
        raise FileNotFoundError(f"No tokenizer files found in {directory}")
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


class GrpcFront:
    def __init__(self, engine: BaseEngine, wire: Wire, port: int = 0, host: str = "127.0.0.1",
                 tokenizer_dir: str | None = None, workers: int = 256):  # fmt: skip
        self.engine = engine
        self.wire = wire
        self.pb = wire.pb
        self.tokenizer_dir = tokenizer_dir or engine.startup_model_path
        self.explicit_tokenizer = tokenizer_dir is not None
        self._bundle: tuple[bytes, str] | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fake-grpc")
        )
        self.server.add_generic_rpc_handlers((self._handlers(),))
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"cannot listen on {host}:{port}")
        self.host = host
        self.aborts: list[str] = []  # request ids the Abort RPC named (tests read it)
        self.ranks: dict[str, int | None] = {}  # request id -> the DP rank it was pinned to
        self.tokenizer_fetches = 0  # GetTokenizer calls answered
        engine.grpc_front = self

    def record(self) -> dict[str, Any]:
        """What the RPCs were given (``GET /_fake/state``'s ``grpc``): each Generate's pinned DP
        rank in arrival order (None: unpinned), the ids Abort named."""
        return {"wire": self.wire.name, "ranks": list(self.ranks.values()), "aborts": list(self.aborts),
                "tokenizer_fetches": self.tokenizer_fetches}  # fmt: skip

    @property
    def url(self) -> str:
        return f"grpc://{self.host}:{self.port}"

    def _handlers(self) -> grpc.GenericRpcHandler:
        pb = self.pb

        def unary(fn, req):
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString, response_serializer=lambda m: m.SerializeToString()
            )

        def stream(fn, req):
            return grpc.unary_stream_rpc_method_handler(
                fn, request_deserializer=req.FromString, response_serializer=lambda m: m.SerializeToString()
            )

        table = {
            "Generate": stream(self.generate, pb.GenerateRequest),
            "HealthCheck": unary(self.health_check, pb.HealthCheckRequest),
            "Abort": unary(self.abort, pb.AbortRequest),
            "GetModelInfo": unary(self.model_info, pb.GetModelInfoRequest),
            "GetServerInfo": unary(self.server_info, pb.GetServerInfoRequest),
            "GetTokenizer": stream(self.get_tokenizer, common_pb2.GetTokenizerRequest),
        }
        if self.wire.has_loads:
            table["GetLoads"] = unary(self.get_loads, pb.GetLoadsRequest)
        return grpc.method_handlers_generic_handler(self.wire.service, table)

    # -- lifecycle (on the engine's trio loop) -------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.server.start()
        try:
            # The generations run here, on the engine's loop: cancelling serve() ends them.
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            # Shielded: stopping grpcio joins its threads, which may be waiting on this loop.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: self.server.stop(0).wait(5))

    def _run(self, fn, *args):
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def _run_sync(self, fn, *args):
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    # -- RPCs (grpcio worker threads) -----------------------------------------------------------------
    def health_check(self, request, context):
        healthy = self.engine.healthy
        return self.pb.HealthCheckResponse(
            healthy=healthy, message="Health" if healthy else "Engine is not alive"
        )

    def model_info(self, request, context):
        return self._run_sync(self._model_info)

    def _model_info(self):
        e = self.engine
        facts: dict[str, Any] = {
            "model_path": e.model_path,
            "served_model_name": e.served_model_name,
            "tokenizer_path": self.tokenizer_dir,
            "model_type": e.checkpoint.model_type,
            "architectures": list(e.checkpoint.architectures),
            "max_context_length": e.config.context_length or e.checkpoint.max_model_len,
            "eos_token_ids": [_eos()],
        }
        if self.wire.name in ("sglang", "tokenspeed"):
            facts["weight_version"] = e.weight_version  # vLLM's message has no such field
        if self.wire.name != "tokenspeed":
            facts["is_generation"] = True
        return self.pb.GetModelInfoResponse(**facts)

    def server_info(self, request, context):
        return self._run_sync(self._server_info)

    def _server_info(self):
        e, c = self.engine, self.engine.config
        if self.wire.name.startswith("vllm"):
            facts = {"active_requests": len(e.scheduler.jobs), "is_paused": e.paused is not None,
                     "server_type": "vllm-grpc", "data_parallel_size": c.dp_size}  # fmt: skip
            if self.wire.name == "vllm-psrl":
                facts.update(tensor_parallel_size=c.tp_size, pipeline_parallel_size=c.pp_size)
            return self.pb.GetServerInfoResponse(**facts)
        args = {"model_path": e.model_path, "served_model_name": e.served_model_name, "tp_size": c.tp_size,
                "dp_size": c.dp_size, "pp_size": c.pp_size, "weight_version": e.weight_version,
                "context_length": e.config.context_length or e.checkpoint.max_model_len}  # fmt: skip
        info = self.pb.GetServerInfoResponse(
            active_requests=len(e.scheduler.jobs), is_paused=e.paused is not None
        )
        if self.wire.name == "tokenspeed":
            from smgrl.fake.tokenspeed_info import server_args

            args = {k: v for k, v in server_args(e).items() if isinstance(v, (str, int, float, bool))}
            info.tokenspeed_version = e.version
        else:
            info.sglang_version = e.version
            info.server_type = "grpc"
        info.server_args.update(args)
        return info

    def get_loads(self, request, context):
        return self._run_sync(self._loads)

    def _loads(self):
        e = self.engine
        dp = e.config.dp_size
        running, waiting = len(e.scheduler.running()), len(e.scheduler.waiting())
        loads = [
            self.pb.SchedulerLoad(dp_rank=r, num_running_reqs=running if r == 0 else 0,
                                  num_waiting_reqs=waiting if r == 0 else 0,
                                  num_total_reqs=(running + waiting) if r == 0 else 0)
            for r in range(dp)
        ]  # fmt: skip
        return self.pb.GetLoadsResponse(version=e.version, dp_rank_count=dp, loads=loads)

    def abort(self, request, context):
        ids = list(request.request_ids) if self.wire.abort_by_ids else [request.request_id]
        self.aborts.extend(ids)
        found = self._run_sync(self._abort, ids)
        if self.wire.abort_by_ids:
            return self.pb.AbortResponse()
        rid = ids[0]
        return self.pb.AbortResponse(
            success=bool(found), message=f"Request {rid} {'aborted' if found else 'not found'}"
        )

    def _abort(self, ids: list[str]) -> int:
        sched = self.engine.scheduler
        return sched.abort([sched.jobs[i] for i in ids if i in sched.jobs])

    def get_tokenizer(self, request, context):
        self.tokenizer_fetches += 1
        try:
            if self._bundle is None:
                fake = {"tokenizer_class": "smgrl-fake", "eos_token_id": _eos(), "model_max_length": 1 << 20}
                self._bundle = tokenizer_bundle(self.tokenizer_dir, None if self.explicit_tokenizer else fake)
        except OSError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        data, sha = self._bundle
        for start in range(0, len(data), CHUNK_SIZE):
            end = min(start + CHUNK_SIZE, len(data))
            yield common_pb2.GetTokenizerChunk(data=data[start:end], sha256=sha if end == len(data) else "")

    def generate(self, request, context):
        job = self._job(request, context)
        out: queue.SimpleQueue = queue.SimpleQueue()
        scope_box: list[trio.CancelScope] = []
        # A client that goes away cancels the trio side; the job then leaves the scheduler.
        context.add_callback(lambda: scope_box and self._cancel(scope_box[0]))
        self._run_sync(self._start_generation, job, request.stream, out, scope_box)
        while True:
            item = out.get()
            if item is _END:
                return
            if isinstance(item, tuple):
                context.abort(*item)
            yield item

    def _cancel(self, scope: trio.CancelScope) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._run_sync(scope.cancel)

    def _job(self, request, context) -> Job:
        prompt = list(request.tokenized.input_ids) if request.HasField("tokenized") else []
        if not prompt:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request has no input_ids")
        # PSRL's fork has a plain int32 (0 = rank 0); upstream marks a pin by presence.
        pinned = self.wire.name == "vllm-psrl" or request.HasField("data_parallel_rank")
        rank = request.data_parallel_rank if pinned else None
        if rank is not None and not 0 <= rank < self.engine.config.dp_size:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"data_parallel_rank {rank} is out of range [0, {self.engine.config.dp_size})",
            )
        self.ranks[request.request_id] = rank
        sp = request.sampling_params
        max_new = sp.max_tokens if self.wire.name.startswith("vllm") else sp.max_new_tokens
        has_max = sp.HasField("max_tokens" if self.wire.name.startswith("vllm") else "max_new_tokens")
        seed = None
        if self.wire.name.startswith("vllm") and sp.HasField("seed"):
            seed = sp.seed
        elif self.wire.name == "tokenspeed" and sp.HasField("sampling_seed"):
            seed = sp.sampling_seed
        job = Job(rid=request.request_id or uuid.uuid4().hex, prompt_ids=prompt,
                  max_new_tokens=max_new if has_max else 128, stop=tuple(sp.stop),
                  stop_token_ids=tuple(sp.stop_token_ids), ignore_eos=sp.ignore_eos, seed=seed)  # fmt: skip
        # Log-probs asked for: vLLM's SamplingParams.logprobs (presence), the others' return_logprob.
        asked = sp.HasField("logprobs") if self.wire.name.startswith("vllm") else request.return_logprob
        job.opts = {"return_logprob": bool(asked)}
        return job

    def _start_generation(self, job: Job, stream: bool, out: queue.SimpleQueue, scope_box: list) -> None:
        scope = trio.CancelScope()
        scope_box.append(scope)
        self._nursery.start_soon(self._generation, job, stream, out, scope)

    async def _generation(
        self, job: Job, stream: bool, out: queue.SimpleQueue, scope: trio.CancelScope
    ) -> None:
        engine = self.engine
        sent = 0
        try:
            with scope:
                async with engine.admission():
                    with engine.scheduler.admitted([job]):
                        async with contextlib.aclosing(engine.scheduler.steps(job)) as steps:
                            async for _ in steps:
                                if stream and len(job.output_ids) > sent:
                                    out.put(self._chunk(job, sent))
                                    sent = len(job.output_ids)
                out.put(self._complete(job))
        finally:
            out.put(_END)

    def _common(self, job: Job) -> dict[str, Any]:
        return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": len(job.output_ids),
                "cached_tokens": job.cached_tokens}  # fmt: skip

    def _chunk(self, job: Job, sent: int):
        pb = self.pb
        chunk = pb.GenerateStreamChunk(token_ids=job.output_ids[sent:], **self._common(job))
        if job.opts.get("return_logprob"):
            chunk.output_logprobs.CopyFrom(self._logprobs(job, sent))
        if self.wire.name == "tokenspeed":
            chunk.weight_version = job.weight_version or self.engine.weight_version
        return self._response(job, chunk=chunk)

    def _complete(self, job: Job):
        finish = job.finish or {"type": "abort"}
        kind = finish.get("type")
        reason = kind if kind in ("stop", "length", "abort") else "stop"
        complete = self.pb.GenerateComplete(
            output_ids=job.output_ids, finish_reason=reason, **self._common(job)
        )
        if job.opts.get("return_logprob"):
            complete.output_logprobs.CopyFrom(self._logprobs(job, 0))
        matched = finish.get("matched")
        if isinstance(matched, bool) or matched is None:
            pass
        elif isinstance(matched, int):
            complete.matched_token_id = matched
        else:
            complete.matched_stop_str = str(matched)
        if self.wire.name == "tokenspeed":
            complete.weight_version = job.weight_version or self.engine.weight_version
        return self._response(job, complete=complete)

    def _logprobs(self, job: Job, start: int):
        return self.pb.OutputLogProbs(
            token_logprobs=job.output_logprobs[start:], token_ids=job.output_ids[start:]
        )

    def _response(self, job: Job, **kw):
        if self.wire.name.startswith("vllm"):
            return self.pb.GenerateResponse(**kw)  # vLLM's response names no request id
        return self.pb.GenerateResponse(request_id=job.rid, **kw)


def _eos() -> int:
    from smgrl.fake import model

    return model.eos_id()
