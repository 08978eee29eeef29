"""Start fake engines in-process: ``async with fake_fleet("sglang", n=3) as fleet: ...``.

Every engine listens on its own 127.0.0.1 port inside one nursery owned by the context
manager; leaving the block cancels it (listeners and connections close). All engines of a
fleet share one default checkpoint (so they generate the same text, like replicas of one model)
and one process-wide concurrency gauge (``fleet.peak_concurrency``: the most control calls in
flight across the fleet at once, what a fan-out concurrency cap bounds).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import trio

from smgrl.fake.base import BaseEngine, EngineConfig
from smgrl.fake.checkpoint import DEFAULT_MODEL_NAME, make_checkpoint
from smgrl.fake.sglang import SGLangEngine
from smgrl.fake.sync import Gauge
from smgrl.fake.tokenspeed import TokenSpeedEngine
from smgrl.fake.vllm import VLLMEngine

ENGINE_KINDS: dict[str, type[BaseEngine]] = {
    "sglang": SGLangEngine,
    "vllm": VLLMEngine,
    "tokenspeed": TokenSpeedEngine,
}


@attrs.define(eq=False)
class Fleet:
    kind: str
    engines: list[BaseEngine]
    gauge: Gauge

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    @property
    def peak_concurrency(self) -> int:
        return self.gauge.peak

    def clear_calls(self) -> None:
        for engine in self.engines:
            engine.clear_calls()
        self.gauge.reset()

    def __len__(self) -> int:
        return len(self.engines)

    def __getitem__(self, index: int) -> BaseEngine:
        return self.engines[index]


def make_engine(
    kind: str, config: EngineConfig | None = None, *, gauge_parent: Gauge | None = None
) -> BaseEngine:
    try:
        cls = ENGINE_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r} (expected one of {sorted(ENGINE_KINDS)})") from None
    return cls(config or EngineConfig(), gauge_parent=gauge_parent)


def build_engines(
    kind: str, ports: Sequence[int], config: dict[str, Any], default_root: str, gauge: Gauge
) -> list[BaseEngine]:
    """Engines for ``ports`` sharing ``config``; a default checkpoint under ``default_root``."""
    settings = dict(config)
    if settings.get("model_path") is None:
        path = make_checkpoint(f"{default_root}/{DEFAULT_MODEL_NAME.replace('/', '--')}", DEFAULT_MODEL_NAME)
        settings["model_path"] = str(path)
        # A path given by us, not the user: keep the default model name (SGLang would use the path).
        settings["served_model_name"] = settings.get("served_model_name") or DEFAULT_MODEL_NAME
    return [
        make_engine(kind, EngineConfig(**{**settings, "port": port}), gauge_parent=gauge) for port in ports
    ]


@contextlib.asynccontextmanager
async def fake_fleet(
    kind: str = "sglang", n: int = 1, *, ports: Sequence[int] | None = None, **config: Any
) -> AsyncIterator[Fleet]:
    """Run ``n`` fake engines of ``kind`` (or one per entry of ``ports``; 0 = ephemeral).

    ``config`` holds :class:`EngineConfig` fields (``dp_size=2``, ``api_key="k"``, ...).
    """
    gauge = Gauge()
    with tempfile.TemporaryDirectory(prefix="smgrl-fake-fleet-") as root:
        engines = build_engines(kind, list(ports) if ports is not None else [0] * n, config, root, gauge)
        # The fleet's nursery owns every engine's server; cancelling it on exit closes all
        # listeners and connections before the temporary checkpoint is removed.
        async with trio.open_nursery() as nursery:
            for engine in engines:
                await nursery.start(engine.serve)
            try:
                yield Fleet(kind, engines, gauge)
            finally:
                nursery.cancel_scope.cancel()


async def start_engine(nursery: trio.Nursery, kind: str = "sglang", **config: Any) -> BaseEngine:
    """Start one engine in the caller's nursery (it runs until that nursery is cancelled)."""
    engine = make_engine(kind, EngineConfig(**config))
    await nursery.start(engine.serve)
    return engine
