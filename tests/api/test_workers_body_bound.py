"""`/workers` bodies far larger than any worker spec are refused before they are parsed.

SMG takes bodies up to --max-payload-size (512 MiB) there; serde's exact reading of an invalid
body costs about 0.5 us per byte on the event loop (a 2 MB one held it for a second, on a route
open without keys). smgrl refuses a body over 64 KiB with 413 PAYLOAD_TOO_LARGE, whether its
length is declared or it arrives chunked (a documented deviation: docs/deviations.md).
"""

from __future__ import annotations

import json

from smgrl.core.config import Config
from smgrl.http.bodies.workers_body import WORKERS_BODY_LIMIT
from smgrl.testing import gateway_in_process

JSON = {"content-type": "application/json"}


async def _chunks(data: bytes):
    for i in range(0, len(data), 16 * 1024):
        yield data[i : i + 16 * 1024]


async def test_a_workers_body_far_larger_than_a_spec_is_413_before_it_is_parsed():
    async with gateway_in_process(Config()) as gw:
        invalid = b'{"url": "http://127.0.0.1:1", "labels": {"a": "' + b"x" * 2_000_000 + b'", }'
        valid_large = json.dumps(
            {"url": "http://127.0.0.1:2", "labels": {"a": "x" * (WORKERS_BODY_LIMIT + 1)}}
        )
        for method, path, body in (
            ("POST", "/workers", invalid),
            ("POST", "/workers", valid_large.encode()),
            ("PUT", "/workers/00000000-0000-0000-0000-000000000000", invalid),
            ("PATCH", "/workers/00000000-0000-0000-0000-000000000000", invalid),
        ):
            for content in (body, _chunks(body)):  # declared, then chunked (no content-length)
                r = await gw.client.request(method, path, content=content, headers=JSON)
                assert r.status_code == 413, (method, r.status_code, r.text[:200])
                assert r.json()["code"] == "PAYLOAD_TOO_LARGE" and "64 KiB" in r.json()["error"]
        assert not list(gw.store.read(types=["worker.registered"]))
        # A spec with many labels is far below the bound.
        labels = {f"label-{i}": "v" * 40 for i in range(200)}
        r = await gw.client.post("/workers", json={"url": "http://127.0.0.1:3", "labels": labels})
        assert r.status_code == 202, r.text
