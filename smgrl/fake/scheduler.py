"""In-flight generations of one fake engine: a job per request, stepped one token at a time.

The engines put their own admission rules in front (SGLang blocks while paused, vLLM answers
503, ...). Once admitted, a job lives here until it finishes. The scheduler models what the
pause modes act on:

* ``frozen``: the scheduler stops forwarding; running jobs wait at the next token boundary
  (SGLang retract/in_place, vLLM and TokenSpeed keep).
* ``Job.retracted``: the job's KV was freed (SGLang retract); it counts as waiting, not
  running, and resumes (recomputed under the current weights) when unfrozen.
* ``abort``: a job finishes at its next token boundary with an abort finish reason.

Each token is generated from the weights digest current at that moment, and stamped with the
current weight version, so a request that straddles a refit reports version spans.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

import attrs
import trio

from smgrl.fake import model
from smgrl.fake.sync import Notifier

_CACHE_LIMIT = 200_000
_CHECKPOINT_EVERY = 64


@attrs.define(eq=False)
class Job:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    output_ids: list[int] = attrs.Factory(list)
    output_logprobs: list[float] = attrs.Factory(list)
    spans: list[list] = attrs.Factory(list)  # [version, start, end) over output tokens
    finish: dict | None = None  # SGLang-shaped finish reason
    abort_requested: bool = False
    abort_message: str | None = None  # None: the engine's default message
    abort_reason: dict | None = None  # a caller-supplied finished_reason replaces ours
    retracted: bool = False
    num_retractions: int = 0
    cached_tokens: int = 0
    started: bool = False
    created: float = 0.0
    stop_text: str | None = None  # a matched stop string, cut from the text
    key: int = 0  # the rolling key of the context so far (prompt + outputs): model.context_key
    keys: list[int] = attrs.Factory(list)  # the context key before each output token
    planned: list[int] | None = None  # a scripted reply (model.plan), real-tokenizer mode only

    opts: dict = attrs.Factory(dict)  # per-API output options (logprobs, ...)

    @property
    def text(self) -> str:
        # A matched stop string is the last token and is trimmed, like the engines do.
        ids = self.output_ids[:-1] if self.stop_text is not None else self.output_ids
        return model.decode(ids)

    def delta_text(self, start: int) -> str:
        """Text of output tokens ``start:`` (for streaming deltas)."""
        end = len(self.output_ids) - (1 if self.stop_text is not None else 0)
        return model.decode(self.output_ids[start:end]) if end > start else ""

    @property
    def weight_version(self) -> str | None:
        return self.spans[-1][0] if self.spans else None

    @property
    def finished(self) -> bool:
        return self.finish is not None


@attrs.define(eq=False)
class Scheduler:
    digest: str
    weight_version: Callable[[], str]
    token_latency_s: Callable[[], float]
    changed: Notifier = attrs.Factory(Notifier)
    jobs: dict[str, Job] = attrs.Factory(dict)
    frozen: bool = False
    _cache: set[int] = attrs.Factory(set)
    _digest_bytes: bytes | None = None

    # -- queries -------------------------------------------------------------------------------
    def running(self) -> list[Job]:
        return [j for j in self.jobs.values() if not j.retracted]

    def waiting(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.retracted]

    # -- control -------------------------------------------------------------------------------
    def set_frozen(self, frozen: bool) -> None:
        self.frozen = frozen
        self.changed.notify()

    def retract_all(self) -> None:
        for job in self.jobs.values():
            if not job.retracted:
                job.retracted = True
                job.num_retractions += 1
        self.changed.notify()

    def abort(self, jobs: Iterable[Job], message: str | None = None, reason: dict | None = None) -> int:
        count = 0
        for job in list(jobs):
            if job.finish is None and not job.abort_requested:
                job.abort_requested = True
                job.abort_message = message
                job.abort_reason = reason
                count += 1
        self.changed.notify()
        return count

    def abort_all(self, message: str | None = None) -> int:
        return self.abort(self.jobs.values(), message)

    def flush_cache(self) -> None:
        self._cache.clear()

    def load(self, digest: str) -> None:
        self.digest = digest
        self._digest_bytes = bytes.fromhex(digest)
        self.changed.notify()

    # -- generation ----------------------------------------------------------------------------
    def admit(self, job: Job) -> None:
        job.created = trio.current_time()
        job.key = model.context_key(job.prompt_ids)
        job.planned = model.plan(job.prompt_ids)
        hashes = model.prefix_hashes(job.prompt_ids)
        cached = 0
        for i, h in enumerate(hashes[:-1]):  # the last prompt token is always computed
            if h not in self._cache:
                break
            cached = i + 1
        job.cached_tokens = cached
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.clear()
        self._cache.update(hashes)
        self.jobs[job.rid] = job
        self.changed.notify()

    @contextlib.contextmanager
    def admitted(self, jobs: list[Job]) -> Iterator[None]:
        """Admit ``jobs``; on exit (normal, error or cancel) none of them stays registered."""
        for job in jobs:
            self.admit(job)
        try:
            yield
        finally:
            for job in jobs:
                if self.jobs.get(job.rid) is job:
                    del self.jobs[job.rid]
            self.changed.notify()

    async def steps(self, job: Job) -> AsyncIterator[Job]:
        """Generate ``job`` to completion, yielding after each new token (for streaming).

        The caller must have called :meth:`admit`. The job leaves ``jobs`` when this generator
        ends or is closed (client gone), so a pause waiting for the engine to drain sees it go.
        """
        try:
            while True:
                if job.abort_requested:
                    job.finish = _abort_reason(job)
                    yield job
                    break
                if self.frozen:
                    # Parked at a token boundary until unfrozen or aborted (both notify).
                    await self.changed.wait()
                    continue
                if job.retracted:
                    job.retracted = False  # recomputed now, under the current weights
                if len(job.output_ids) >= job.max_new_tokens:
                    job.finish = {"type": "length", "length": job.max_new_tokens}
                    yield job
                    break
                self._emit(job)
                self.changed.notify()  # in-process observers (tests) wait on token progress
                yield job
                if job.finish is not None:
                    break
                delay = self.token_latency_s()
                if delay > 0:
                    await trio.sleep(delay)
                elif len(job.output_ids) % _CHECKPOINT_EVERY == 0:
                    # Long zero-latency generations still let other tasks run.
                    await trio.lowlevel.checkpoint()
        finally:
            if self.jobs.get(job.rid) is job:
                del self.jobs[job.rid]
            self.changed.notify()

    async def run(self, job: Job) -> Job:
        async for _ in self.steps(job):
            pass
        return job

    def _emit(self, job: Job) -> None:
        position = len(job.output_ids)
        if self._digest_bytes is None:
            self._digest_bytes = bytes.fromhex(self.digest)
        # Autoregressive: the next token follows from the weights and the whole context.
        token, logprob = model.next_token(
            self._digest_bytes, job.key, job.seed, job.planned, len(job.output_ids)
        )
        job.keys.append(job.key)
        job.key = model.extend_key(job.key, token)
        job.started = True
        job.output_ids.append(token)
        job.output_logprobs.append(logprob)
        version = self.weight_version()
        if job.spans and job.spans[-1][0] == version:
            job.spans[-1][2] = position + 1
        else:
            job.spans.append([version, position, position + 1])
        if token == model.eos_id() and not job.ignore_eos or token in job.stop_token_ids:
            job.finish = {"type": "stop", "matched": token}
        elif job.stop and model.token_text(token).strip() in job.stop:
            job.stop_text = model.token_text(token).strip()
            job.finish = {"type": "stop", "matched": job.stop_text}
        elif len(job.output_ids) >= job.max_new_tokens:
            job.finish = {"type": "length", "length": job.max_new_tokens}


def _abort_reason(job: Job) -> dict:
    if job.abort_reason is not None:
        return job.abort_reason
    if job.retracted or not job.started:
        # Still in the waiting queue: the tokenizer manager answers for the scheduler, with
        # only type and message (SGLang's ``_handle_abort_req``).
        return {"type": "abort", "message": job.abort_message or "Abort in waiting queue"}
    # FINISH_ABORT.to_json() of a running request.
    return {"type": "abort", "message": job.abort_message or "Aborted", "status_code": None, "err_type": None}
