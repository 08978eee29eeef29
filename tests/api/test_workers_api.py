"""The SMG-compatible worker API `/workers` and `/workers/{id}` (SMG 1.13.0's
`POST /workers`, capabilities and labels, observed); texts observed on SMG 1.13.0 (serde/axum/uuid wording)."""

from __future__ import annotations

import pytest
import trio
from rl_api_helpers import UUID, assert_json, rl_cfg, sent_headers

from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

IJD = "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
JSE = "JSON syntax error: Failed to parse the request body as JSON: "
SCHEME = " - URL must start with a lowercase http://, https://, grpc://, grpcs://, or ipc:// scheme"
CREDS = (
    " - a worker URL must not carry credentials (user:password@); give the engine's key as api_key "
    "(POST /workers) or --api-key (smgrl launch)"
)
U0 = "00000000-0000-0000-0000-000000000000"


def bad(text: str) -> dict:
    return {"error": text, "code": "BAD_REQUEST"}


BAD_BODIES = [
    ("{}", IJD + "missing field `url` at line 1 column 2"),
    ('{"url":1}', IJD + "url: invalid type: integer `1`, expected a string at line 1 column 8"),
    ('{"url":null}', IJD + "url: invalid type: null, expected a string at line 1 column 11"),
    (
        '{"url":"http://a:1","labels":{"x":1}}',
        IJD + "labels.x: invalid type: integer `1`, expected a string at line 1 column 35",
    ),
    (
        '{"url":"http://a:1","labels":[]}',
        IJD + "labels: invalid type: sequence, expected a map at line 1 column 29",
    ),
    (
        '{"url":"ftp://a","labels":null}',
        IJD + "labels: invalid type: null, expected a map at line 1 column 30",
    ),
    ('{"url":"http://a:1",', JSE + "EOF while parsing a value at line 1 column 20"),
    ("", JSE + "EOF while parsing a value at line 1 column 0"),
    ("[]", IJD + "invalid length 0, expected struct WorkerSpec with 29 elements at line 1 column 2"),
    ("null", IJD + "invalid type: null, expected struct WorkerSpec at line 1 column 4"),
    ('{"url":"HTTP://a:1"}', "Invalid value for field 'worker_url': HTTP://a:1" + SCHEME),
    ('{"url":"ftp://a"}', "Invalid value for field 'worker_url': ftp://a" + SCHEME),
    ('{"url":"http://"}', "Invalid value for field 'worker_url': http:// - Invalid URL format: empty host"),
    ('{"url":"127.0.0.1:31002"}', "Invalid value for field 'worker_url': 127.0.0.1:31002" + SCHEME),
    (
        '{"url":"http://u:PASS@127.0.0.1:1"}',
        "Invalid value for field 'worker_url': http://***@127.0.0.1:1" + CREDS,
    ),
    ('{"url":"https://tok@h/v1"}', "Invalid value for field 'worker_url': https://***@h/v1" + CREDS),
    ('{"url":"ftp://u:PASS@h"}', "Invalid value for field 'worker_url': ftp://***@h" + SCHEME),
    (
        '{"url":"http://a:1","worker_type":"foo"}',
        IJD + "worker_type: unknown variant `foo`, expected one of "
        "`regular`, `prefill`, `decode`, `encode` at line 1 column 39",
    ),
    ('{"url":"ftp://a","worker_type":null}', JSE + "worker_type: expected value at line 1 column 32"),
    (
        '{"url":"http://a:1","api_key":5}',
        IJD + "api_key: invalid type: integer `5`, expected a string at line 1 column 31",
    ),
    (
        '{"url":"ftp://a","bootstrap_port":70000}',
        IJD + "bootstrap_port: invalid value: integer `70000`, expected u16 at line 1 column 39",
    ),
    (
        '{"url":"ftp://a","runtime":"x"}',
        IJD + "runtime: unknown variant `x`, expected one of `unspecified`, "
        "`sglang`, `vllm`, `trtllm`, `mlx`, `tokenspeed`, `generic`, `external` at line 1 column 30",
    ),
    ('{"url":"ftp://a","url":"b"}', IJD + "duplicate field `url` at line 1 column 22"),
    ('{"url":"ftp://a"} x', JSE + "trailing characters at line 1 column 19"),
    ('{"url":"ftp://a",}', JSE + "trailing comma at line 1 column 18"),
    ('{"url":"ftp://a","labels":{"a":"b",}}', JSE + "labels.?: trailing comma at line 1 column 36"),
    ("{'url':1}", JSE + "key must be a string at line 1 column 2"),
    ('{"url":01}', JSE + "url: invalid number at line 1 column 9"),
    ('{"url":1e999}', JSE + "url: number out of range at line 1 column 12"),
    # An integer past Python's 4,300-digit str->int limit answered 500 (serde makes it an f64: out of range).
    ('{"url":' + "9" * 5000 + "}", JSE + "url: number out of range at line 1 column 5007"),
    (
        '{"url":"ftp://a","bootstrap_port":-' + "1" * 4400 + "}",
        JSE + "bootstrap_port: number out of range at line 1 column 4435",
    ),
    ('{"url":"a\\q"}', JSE + "url: invalid escape at line 1 column 11"),
    ('{"url":"ftp://a","x":[1,\n}', JSE + "x: expected value at line 2 column 1"),
    ('{"url":"ftp://a","models":[{}]}', IJD + "models[0]: missing field `id` at line 1 column 29"),
    (
        '{"url":"ftp://a","model_id":1}',
        "Invalid value for field 'worker_url': ftp://a" + SCHEME,
    ),  # not a field
]


@pytest.mark.parametrize("body,text", BAD_BODIES)
async def test_post_bad_bodies(rl_config, body, text):
    async with gateway_in_process(rl_config) as gw:
        r = await gw.client.post(
            "/workers", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert_json(r, 400, bad(text), {"content-type", "content-length", "x-request-id"})
        assert list(gw.gateway.fleet.registry) == []


async def test_content_type_rules(rl_config):
    async with gateway_in_process(rl_config) as gw:
        body = b'{"url":"ftp://a"}'
        for ctype in (None, "text/json", "application/x-www-form-urlencoded", "application/json-seq"):
            headers = {"content-type": ctype} if ctype else {}
            r = await gw.client.post("/workers", content=body, headers=headers)
            assert_json(r, 400, bad("Missing Content-Type: application/json header"))
        for ctype in ("application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.api+json"):
            r = await gw.client.post("/workers", content=body, headers={"content-type": ctype})
            assert r.json()["error"].startswith("Invalid value for field 'worker_url'")


async def test_register_get_patch_put_delete(rl_config):
    async with (
        fake_fleet("sglang", 1, api_key="wk-Secret-7f3a") as fleet,
        gateway_in_process(rl_config) as gw,
    ):
        url = fleet.urls[0]
        r = await gw.client.post(
            "/workers",
            json={
                "url": url,
                "api_key": "wk-Secret-7f3a",
                "labels": {"role": "policy"},
                "unknown": [1, {"a": None}],
                "model_id": "ignored",
            },
        )
        wid = r.json()["worker_id"]
        assert UUID.match(wid)
        assert r.headers["location"] == f"/workers/{wid}"
        assert_json(
            r,
            202,
            {
                "status": "accepted",
                "worker_id": wid,
                "url": url,
                "location": f"/workers/{wid}",
                "message": "Worker addition queued for background processing",
            },
            {"content-type", "content-length", "x-request-id", "location"},
        )
        await gw.wait_visible(1)
        engine = fleet.engines[0]
        assert all(c.headers.get("authorization") == "Bearer wk-Secret-7f3a" for c in engine.calls)
        got = await gw.client.get(f"/workers/{wid}")
        body = got.json()
        assert list(body) == [
            "id",
            "model_id",
            "url",
            "models",
            "worker_type",
            "connection_mode",
            "runtime_type",
            "labels",
            "priority",
            "cost",
            "max_connection_attempts",
            "is_healthy",
            "status",
            "load",
            "http2",
        ]
        assert (body["id"], body["model_id"], body["url"], body["runtime_type"], body["status"]) == (
            wid,
            "fake/Qwen3-0.6B",
            url,
            "sglang",
            "ready",
        )
        assert body["models"] == [
            {
                "id": "fake/Qwen3-0.6B",
                "model_type": ["chat", "completions", "responses", "tools"],
                "hf_model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
                "context_length": 40960,
                "tokenizer_path": engine.model_path,
            }
        ]
        assert body["labels"]["role"] == "policy" and "wk-Secret-7f3a" not in got.text
        listed = await gw.client.get("/workers")
        assert listed.json()["total"] == 1 and listed.json()["stats"] == {
            "prefill_count": 0,
            "decode_count": 0,
            "regular_count": 1,
        }
        # The worker key is the engine's bearer on control calls too.
        engine.clear_calls()
        await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert sent_headers(engine.calls[0]) == {"accept": "*/*", "authorization": "Bearer wk-Secret-7f3a"}

        # 409 for the same URL.
        r = await gw.client.post("/workers", json={"url": url})
        assert_json(
            r,
            409,
            {
                "error": f"Worker already exists at URL '{url}' with ID {wid}. Use PUT /workers/{wid} "
                f"to replace or PATCH /workers/{wid} to update.",
                "code": "WORKER_ALREADY_EXISTS",
            },
        )

        accepted = {
            "status": "accepted",
            "worker_id": wid,
            "message": "Worker update queued for background processing",
        }
        # PATCH merges labels; rl.* labels switch the capability source.
        r = await gw.client.patch(f"/workers/{wid}", json={"labels": {"rl.abort": "false", "tp_size": "2"}})
        assert_json(r, 202, accepted)
        row = (await gw.client.get(f"/v1/rl/workers/{wid}")).json()
        assert row["labels"]["role"] == "policy" and row["role"] == "policy" and row["tp_size"] == 2
        assert row["capabilities"]["source"] == "label" and row["capabilities"]["abort"] is False
        # PUT replaces them: back to the engine's tp_size and the static row.
        r = await gw.client.put(f"/workers/{wid}", json={"url": url, "labels": {"x": "1"}})
        assert_json(r, 202, accepted)
        row = (await gw.client.get(f"/v1/rl/workers/{wid}")).json()
        assert "role" not in row["labels"] and row["labels"]["x"] == "1" and row["tp_size"] == 1
        assert row["capabilities"]["source"] == "static" and row["role"] is None
        r = await gw.client.delete(f"/workers/{wid}")
        assert_json(
            r,
            202,
            {
                "status": "accepted",
                "worker_id": wid,
                "message": "Worker removal queued for background processing",
            },
        )
        with trio.fail_after(5):
            while list(gw.gateway.fleet.registry):
                await trio.sleep(0.01)
        r = await gw.client.get(f"/workers/{wid}")
        assert_json(r, 404, {"error": f"Worker {wid} not found", "code": "WORKER_NOT_FOUND"})


INVALID_IDS = [
    ("nope", "invalid character: found `n` at 0"),
    ("0000000000000000000000000000000", "invalid length: found 31"),
    ("0000000000000000000000000000000g", "invalid character: found `g` at 31"),
    ("00000000-0000-0000-0000", "invalid group count: expected 5, found 4"),
    ("0000000-00000-0000-0000-000000000000", "invalid group length in group 0: expected 8, found 7"),
    ("00000000-0000-0000-0000-0000000000000", "invalid group length in group 4: expected 12, found 13"),
    ("%7B00000000-0000-0000-0000-000000000000", "invalid character: found `{` at 0"),
    ("%C3%A90000000-0000-0000-0000-000000000000", "invalid character: found `é` at 0"),
]


async def test_invalid_and_unknown_ids(rl_config):
    async with gateway_in_process(rl_config) as gw:
        for raw, problem in INVALID_IDS:
            shown = raw.replace("%7B", "{").replace("%C3%A9", "é")
            for method in ("GET", "DELETE"):
                r = await gw.client.request(method, f"/workers/{raw}")
                assert_json(r, 400, bad(f"Invalid worker_id '{shown}' (expected UUID). Error: {problem}"))
        for wid in (U0, U0.replace("-", ""), f"urn:uuid:{U0}", U0.upper()):
            for method in ("GET", "DELETE"):
                r = await gw.client.request(method, f"/workers/{wid}")
                assert_json(r, 404, {"error": f"Worker {wid} not found", "code": "WORKER_NOT_FOUND"})
        # PUT/PATCH read the body before the id.
        r = await gw.client.put(
            "/workers/nope", content=b'{"url":', headers={"content-type": "application/json"}
        )
        assert_json(r, 400, bad(JSE + "url: EOF while parsing a value at line 1 column 7"))
        r = await gw.client.patch("/workers/nope", content=b"{}", headers={"content-type": "text/plain"})
        assert_json(r, 400, bad("Missing Content-Type: application/json header"))
        r = await gw.client.patch(
            f"/workers/{U0}", content=b'{"labels":{"a":1}}', headers={"content-type": "application/json"}
        )
        assert_json(
            r, 400, bad(IJD + "labels.a: invalid type: integer `1`, expected a string at line 1 column 16")
        )
        r = await gw.client.patch(f"/workers/{U0}", json={"labels": None})
        assert_json(r, 404, {"error": f"Worker {U0} not found", "code": "WORKER_NOT_FOUND"})
        r = await gw.client.put(f"/workers/{U0}", json={})
        assert_json(r, 400, bad(IJD + "missing field `url` at line 1 column 2"))


async def test_put_on_a_dp_rank_is_refused():
    cfg = rl_cfg(dp_aware=True)
    async with (
        fake_fleet("sglang", 1, dp_size=2) as fleet,
        gateway_in_process(cfg, worker_urls=fleet.urls) as gw,
    ):
        rank0 = next(w for w in gw.gateway.fleet.registry if w.url.endswith("@0"))
        r = await gw.client.put(f"/workers/{rank0.id}", json={"url": fleet.urls[0]})
        assert_json(
            r,
            400,
            bad(
                f"Worker '{rank0.url}' belongs to a data-parallel group. PUT is not supported for "
                "data-parallel workers. Use DELETE + POST instead."
            ),
        )
        listed = (await gw.client.get("/workers")).json()["workers"]
        assert list(listed[0]) == [
            "id",
            "model_id",
            "url",
            "models",
            "worker_type",
            "connection_mode",
            "runtime_type",
            "labels",
            "priority",
            "cost",
            "dp_base_url",
            "dp_rank",
            "dp_size",
            "max_connection_attempts",
            "is_healthy",
            "status",
            "load",
            "http2",
        ]
        assert sorted((w["url"], w["dp_rank"], w["dp_size"], w["dp_base_url"]) for w in listed) == [
            (f"{fleet.urls[0]}@0", 0, 2, fleet.urls[0]),
            (f"{fleet.urls[0]}@1", 1, 2, fleet.urls[0]),
        ]


async def test_oversized_bodies():
    async with gateway_in_process(rl_cfg(max_payload_size=100)) as gw:
        r = await gw.client.post("/workers", content=b"x" * 101, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_body_too_large"

        async def chunks():
            for _ in range(3):
                yield b"x" * 50

        r = await gw.client.post("/workers", content=chunks(), headers={"content-type": "application/json"})
        assert_json(
            r,
            413,
            {
                "error": "Request body exceeded the payload limit (max_payload_size)",
                "code": "PAYLOAD_TOO_LARGE",
            },
        )
        r = await gw.client.post("/workers", content=chunks())
        assert_json(r, 400, bad("Missing Content-Type: application/json header"))


async def test_runtime_hint_chooses_the_discovery(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config) as gw:
        r = await gw.client.post("/workers", json={"url": fleet.urls[0], "runtime": "vllm"})
        assert r.status_code == 202
        await gw.wait_visible(1)
        row = (await gw.client.get("/v1/rl/workers")).json()["workers"][0]
        assert row["engine"] == "vllm" and row["tp_size"] is None
        assert [c.path for c in fleet.engines[0].calls] == ["/health", "/v1/models", "/version"]


async def test_post_workers_cancelled_after_its_event_is_queued_still_loads_the_key_and_discovers(tmp_path):
    """The key ring and the discovery job follow from the commit, not from the handler
    after its await. The client goes away while worker.registered waits for the journal's write
    lock (held by another process); once written, the engine (which requires its key) is
    discovered."""
    import sqlite3

    import trio.testing

    from journal import SqliteStore

    path = tmp_path / "j.db"
    store = SqliteStore.open(path)
    async with (
        fake_fleet("sglang", 1, api_key="engine-key-7") as fleet,
        gateway_in_process(rl_cfg(), store=store) as gw,
    ):
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        scope = trio.CancelScope()

        async def client() -> None:
            with scope:
                await gw.client.post("/workers", json={"url": fleet.urls[0], "api_key": "engine-key-7"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            with trio.fail_after(10):
                while gw.writer.lock_waits == 0:  # worker.registered is queued, waiting for the lock
                    await trio.sleep(0.001)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert scope.cancelled_caught
            other.execute("COMMIT")
        other.close()
        await gw.wait_visible(1)  # discovered: the job started and used the key
        (worker,) = list(gw.gateway.fleet.registry)
        assert gw.gateway.keys.get(worker.group) == "engine-key-7"
        assert all(c.headers.get("authorization") == "Bearer engine-key-7" for c in fleet.engines[0].calls)
    store.close()


@pytest.mark.parametrize(
    "labels",
    [
        {"max_model_len": "²"},  # "²".isdigit() is True, int("²") raises
        {"max_model_len": "9" * 5000},  # int() refuses 4,300+ digits
        {"architectures": "[" * 100_000},  # json.loads: RecursionError
        {"tp_size": "9" * 5000, "dp_size": "9" * 5000, "pp_size": "²"},
    ],
)
async def test_a_label_value_never_breaks_the_worker_listings(rl_config, labels):
    # Found against a live gateway: one POST /workers with such a label answered 500 on every
    # GET /workers (or GET /v1/rl/workers) from then on, restarts included (it is journaled).
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config) as gw:
        r = await gw.client.post("/workers", json={"url": fleet.urls[0], "labels": labels})
        wid = r.json()["worker_id"]
        await gw.wait_visible(1)
        for path in ("/workers", f"/workers/{wid}", "/v1/rl/workers", f"/v1/rl/workers/{wid}"):
            r = await gw.client.get(path)
            assert r.status_code == 200, (path, r.text[:200])
        card = (await gw.client.get(f"/workers/{wid}")).json()["models"][0]
        assert card["id"] == "fake/Qwen3-0.6B"
        if "architectures" in labels:
            assert "architectures" not in card  # not JSON that can be read: left out, as before
