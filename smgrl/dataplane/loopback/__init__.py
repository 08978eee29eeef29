"""Partial-rollout loopback: a rollout aborted by a weight sync continues where it stopped.

PSRL's gateway keeps every token an engine decoded before a sync aborted the request
(docs/data-plane.md, "Partial-rollout loopback", without the two defects it names). Here:

- **Which aborts**: an engine's ``finish_reason: abort`` is looped back only when a control call
  that aborts running requests (``smgrl.core.aborts``) went through this gateway to that engine
  and had not finished when the request was sent (``FleetState.aborts``, from the journal).
  A trainer's own
  ``abort_request``, an abort sent straight to the engine, or a client that disconnects is a
  deliberate cancellation: the abort is answered as the engine gave it.
- **Which requests**: ``/generate`` with ``input_ids`` and one prompt; with the gateway's tokenizer
  also a ``text`` prompt and the OpenAI routes (``openai``, ``openai_stream``).
- **The continuation**: prompt = the ORIGINAL prompt + every id accumulated so far (never the
  previous leg's prompt: no duplicated tokens on a second abort), ``max_new_tokens`` = the
  original cap minus what was produced (uncapped stays uncapped), pinned to the instance that
  aborted (eligible again once its sync completes) or any instance at the request's pinned
  version floor (staged selection, ``routed.loop_hint``).
- **The answer**: one object as if one engine had generated it: ``output_ids`` and
  ``output_token_logprobs`` of every leg, ``text`` concatenated, ``prompt_tokens`` the original
  prompt's length, ``completion_tokens`` the total, ``weight_versions`` per-token version spans,
  and ``segments``: per leg the engine, DP rank, loopback iteration, token span and the
  operation whose abort ended it.
- **Bounded**: at most ``--max-loopbacks`` per request, then 503 ``loopback_limit_exceeded``.
- **Journaled**: each looped-back request is one ``dataplane.request_looped_back`` event.

The modules: ``model`` (the values, pure), ``decide`` (which requests and answers loop back),
``legs`` (around each continuation), ``buffered`` and ``stream`` (``/generate``), ``openai`` and
``openai_stream`` (the OpenAI routes).
"""

from smgrl.dataplane.loopback.buffered import run_buffered
from smgrl.dataplane.loopback.decide import carries_metadata, loop_causes, loopable, streamable, worth_a_look
from smgrl.dataplane.loopback.legs import current_version, prepare, record
from smgrl.dataplane.loopback.model import Answer, Leg, Rollout, read_leg, start
from smgrl.dataplane.loopback.openai_stream import run as run_openai_stream
from smgrl.dataplane.loopback.stream import run_stream

__all__ = [
    "Answer",
    "Leg",
    "Rollout",
    "carries_metadata",
    "current_version",
    "loop_causes",
    "loopable",
    "prepare",
    "read_leg",
    "record",
    "run_buffered",
    "run_openai_stream",
    "run_stream",
    "start",
    "streamable",
    "worth_a_look",
]
