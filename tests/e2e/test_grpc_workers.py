"""gRPC workers with real processes: fake engine processes (``smgrl fake-engine --grpc``) for
PSRL's vLLM wire and SGLang's, one gateway registering them by URL (``--worker-urls grpc://...``,
no runtime, no label: the wire is found by asking), each listed with its model, engine and wire.
(All four wires register in process: tests/api/test_grpc_registration.py.)"""

from __future__ import annotations

import time

from smgrl.fake import DEFAULT_MODEL_NAME

WIRES = [("sglang", ()), ("vllm", ("--psrl",))]
EXPECTED = {"sglang": "sglang", "vllm": "vllm", "vllm-psrl": "vllm", "tokenspeed": "tokenspeed"}


def test_every_wire_registers_by_url_with_its_model_and_engine(fakes, gateway):
    urls = []
    for kind, extra in WIRES:
        urls += fakes(kind, 1, "--grpc", "--weight-version", "w3", *extra)
    assert all(u.startswith("grpc://127.0.0.1:") for u in urls)
    _, http, _ = gateway("--enable-rl", "--worker-urls", *urls)
    deadline = time.monotonic() + 60
    rows: list = []
    while time.monotonic() < deadline:
        status, _, body = http.request("GET", "/v1/rl/workers")
        rows = body["workers"] if status == 200 else []
        if len(rows) == len(WIRES) and all("grpc_wire" in r["labels"] for r in rows):
            break
        time.sleep(0.1)
    by_url = {r["url"]: r for r in rows}
    assert set(by_url) == set(urls)
    wires = [by_url[u]["labels"]["grpc_wire"] for u in urls]
    assert wires == ["sglang", "vllm-psrl"]
    for url, wire in zip(urls, wires, strict=True):
        row = by_url[url]
        assert row["model_id"] == DEFAULT_MODEL_NAME
        assert row["engine"] == EXPECTED[wire]
        if wire in ("sglang", "tokenspeed"):  # vLLM's wire carries no weight version
            assert row["weight_version"] == "w3"
