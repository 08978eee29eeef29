"""PSRL's calls, end to end: real fake-engine processes and a real gateway process per module.

Each module starts one fleet and one gateway (``Fleet``) and its tests make the HTTP calls PSRL's
code makes, in PSRL's order, reading the answers as PSRL reads them. Workers are registered the
way PSRL's rollout replicas register themselves (``psrl_worker``): a replica index as ``id``, the
model path as ``models[0].id``, and the parallel sizes as labels.
"""

from __future__ import annotations

import pathlib
import time

import attrs
import httpx
import pytest

from smgrl.demo.procs import Child, launch_gateway, start_fake_engines

MODEL = "/ckpt/psrl-policy"  # PSRL registers the model path it loaded, not the engine's served name


def pytest_collection_modifyitems(items):
    here = pathlib.Path(__file__).resolve().parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


def psrl_worker(url: str, replica: int, dp_size: int = 1, model: str = MODEL, runtime: str = "vllm") -> dict:
    """The body PSRL 19c0474 psrl/workers/gen/smg_adapter.py:196 builds (for an HTTP engine
    here: PSRL's replicas are gRPC, the fields are the same)."""
    return {
        "url": url,
        "worker_type": "regular",
        "connection_mode": "http",
        "runtime_type": runtime,
        "models": [{"id": model}],
        "labels": {"max_model_len": "40960", "dp_size": str(dp_size), "tp_size": "1", "pp_size": "1"},
        "id": str(replica),
    }


@attrs.define
class Fleet:
    engines: Child
    urls: list[str]
    gateway: Child
    base: str
    client: httpx.Client
    registered: list = attrs.field(factory=list)
    ids: list = attrs.field(factory=list)  # the worker ids registration answered

    def stop(self) -> None:
        self.client.close()
        self.gateway.stop()
        self.engines.stop()

    def wait(self, predicate, timeout: float = 20.0, what: str = "condition"):
        """Poll ``predicate()`` (bounded); return its first truthy value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"{what} not reached within {timeout:g}s")

    def instances(self) -> list[tuple[str, int]]:
        rows = self.client.get("/workers/stats").json()["workers"]
        return sorted((r["base_worker_id"], r["dp_rank"]) for r in rows)


def start_fleet(tmp: pathlib.Path, kind: str, count: int, engine_args=(), gateway_args=()) -> Fleet:
    engines, urls = start_fake_engines(kind, count, list(engine_args))
    try:
        gw, port = launch_gateway(
            ["--journal", str(tmp / "journal.db"), "--enable-rl", "--disable-health-check", *gateway_args],
            log_dir=tmp,
        )
        base = f"http://127.0.0.1:{port}"
    except BaseException:
        engines.stop()
        raise
    return Fleet(engines, urls, gw, base, httpx.Client(base_url=base, timeout=60))


def register_psrl(fleet: Fleet, dp_size: int = 1, model: str = MODEL, runtime: str = "vllm") -> list[str]:
    """Register every engine as PSRL does; return the worker ids the gateway answered."""
    ids = []
    for index, url in enumerate(fleet.urls):
        r = fleet.client.post("/workers", json=psrl_worker(url, index, dp_size, model, runtime))
        assert r.status_code in (200, 201, 202), r.text
        ids.append(r.json().get("worker_id"))
    return ids
