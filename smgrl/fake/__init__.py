"""Faithful, fast fake inference engines (SGLang 0.5.23, vLLM 0.33.0, TokenSpeed 0.1.1).

Every test, the demo and every benchmark runs against these. In-process::

    async with fake_fleet("sglang", n=3) as fleet:
        fleet.urls                 # ["http://127.0.0.1:PORT", ...]
        fleet.engines[0].paused    # live state; .calls, .knobs, .peak_concurrency, ...

Out of process: ``smgrl fake-engine --kind vllm --ports 31000-31063`` (see ``cli.py``).
Fake-only HTTP surface on every port: ``/_fake/knobs``, ``/_fake/calls``, ``/_fake/state``,
``/_fake/weights`` (see ``knobs.py``).
"""

from smgrl.fake.base import BaseEngine, EngineConfig
from smgrl.fake.checkpoint import DEFAULT_MODEL_NAME, checkpoint_digest, make_checkpoint
from smgrl.fake.fleet import ENGINE_KINDS, Fleet, fake_fleet, make_engine, start_engine
from smgrl.fake.knobs import Knobs, RecordedCall
from smgrl.fake.scripted import read_requests
from smgrl.fake.sglang import SGLangEngine
from smgrl.fake.tokenspeed import TokenSpeedEngine
from smgrl.fake.vllm import VLLMEngine

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ENGINE_KINDS",
    "BaseEngine",
    "EngineConfig",
    "Fleet",
    "Knobs",
    "RecordedCall",
    "SGLangEngine",
    "TokenSpeedEngine",
    "VLLMEngine",
    "checkpoint_digest",
    "fake_fleet",
    "make_checkpoint",
    "make_engine",
    "read_requests",
    "start_engine",
]
