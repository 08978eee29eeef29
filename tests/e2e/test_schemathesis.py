"""A bounded schemathesis run against a LIVE gateway (a real `smgrl launch` process) with fake
engines: every answer must match `GET /openapi.json` (status, content type, headers, body schema)
and no answer may be a gateway 5xx.

Engine-mirrored statuses are the one exception to "no 5xx", and only on the per-worker route: the
gateway's status there IS the engine's (docs/rl-control-plane.md, "Calling one engine"), so an engine's own 5xx comes back as a 5xx
with an `RlCallOutcome` body naming the worker. Such an answer is recognised by its body (a dict
with `worker_id` and `status` equal to the HTTP status) and counted, never excused otherwise. A
502/503/504 the gateway makes itself (unreachable, journal, timeout) fails the run: the engines
are up and the journal is healthy, so none may occur.

Passes (each operation, a bounded number of examples each; no shrinking, no example database):
positive data, negative data (invalid inputs: must be refused with a documented 4xx), and
positive data with real ids, a real selector and real engine routes (the success paths).

Registration bodies carry URLs: before sending, any URL in a `/workers` body is rewritten to a
closed port on 127.0.0.1, so the gateway never probes a host the fuzzer made up (loopback only).
"""

from __future__ import annotations

import json
import re

import pytest

schemathesis = pytest.importorskip("schemathesis")
requests = pytest.importorskip("requests")

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from smgrl.demo.procs import free_port, wait_for_workers

EXAMPLES = {"positive": 8, "negative": 6, "real": 5}  # per operation; ~30 operations
ENGINE_ROUTES = ["flush_cache", "server_info", "get_model_info", "get_weight_version", "health"]
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _mirrored(response) -> bool:
    """An engine's own status, mirrored by the per-worker route (the body names the worker)."""
    if "/engine/" not in response.request.url or "/v1/rl/workers/" not in response.request.url:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and "worker_id" in body and body.get("status") == response.status_code


def _describe(case) -> str:
    try:
        return case.as_curl_command()
    except Exception:  # noqa: BLE001 - best effort, for the failure message only
        return f"{case.method} {case.formatted_path} query={case.query} headers={case.headers} body={case.body!r}"


def test_schemathesis_live_gateway(fakes, gateway):
    urls = fakes("sglang", 3)
    _, http, port = gateway(
        "--enable-rl", "--disable-health-check", "--rl-control-timeout-secs", "5", "--worker-urls", *urls
    )
    base = f"http://127.0.0.1:{port}"
    rows = wait_for_workers(base, 3)
    wid = rows[0]["id"]
    closed = free_port()
    st, _, victim = http.request("POST", "/workers", {"url": f"http://127.0.0.1:{closed}/victim"})
    assert st == 202
    st, headers, _ = http.request("POST", "/v1/rl/engine/flush_cache?selector=engine%3Dsglang", b"{}")
    assert st == 200
    op_id = headers["x-smgrl-operation-id"]

    session = requests.Session()
    doc = session.get(base + "/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.update(base_url=base)
    # The data-plane routes are left out: they relay arbitrary bodies to the engines, and a fuzzed
    # `x-version-tag` floor (any printable version, e.g. `[`) legitimately holds every engine out, so
    # the request waits for an eligible one and may end in a 503 (tests/api/test_openapi.py checks
    # their documentation; tests/e2e/test_dataplane*.py their answers).
    operations = [
        op
        for op in (result.ok() for result in schema.get_all_operations())
        if "dataplane" not in (op.definition.raw.get("tags") or ())
        # This gateway has no --tokenizer-path, so every session route answers its documented 503
        # `sessions_disabled` (tests/tito/test_sessions_api.py and tests/e2e/test_sessions_e2e.py
        # cover the routes with a tokenizer).
        and "sessions" not in (op.definition.raw.get("tags") or ())
        # Event streams never end on their own (tests/e2e/test_journal_stream.py covers them).
        and "text/event-stream" not in json.dumps(op.definition.raw.get("responses"))
    ]
    assert len(operations) >= 30

    counter = iter(range(10**6))
    stats = {"requests": 0, "mirrored_5xx": 0, "statuses": {}}
    failures: list[str] = []
    history: list[str] = []

    def loopback(body):
        if isinstance(body, dict) and isinstance(body.get("url"), str) and "://" in body["url"]:
            scheme = body["url"].split("://", 1)[0]
            if re.fullmatch(r"https?|grpcs?|ipc", scheme):
                body = {**body, "url": f"http://127.0.0.1:{closed}/fuzz{next(counter)}"}
        return body

    def run_one(case, extra_checks) -> None:
        case.body = loopback(case.body) if case.body is not None else case.body
        try:
            response = case.call(session=session, timeout=30)
        except Exception as exc:  # noqa: BLE001 - a dropped connection is a failure to report
            failures.append(
                f"{case.operation.label}: transport error {exc!r}\n  {_describe(case)}\n"
                f"  after: {history[-3:]}"
            )
            return
        stats["requests"] += 1
        history.append(
            f"{case.method} {response.request.url} -> {response.status_code} "
            f"req-headers={dict(response.request.headers)} body={str(response.request.body)[:120]}"
        )
        stats["statuses"][response.status_code] = stats["statuses"].get(response.status_code, 0) + 1
        label = f"{case.method} {response.request.url} body={json.dumps(case.body, default=str)[:200]}"
        if response.status_code >= 500:
            if _mirrored(response):
                stats["mirrored_5xx"] += 1
            else:
                failures.append(f"gateway 5xx {response.status_code}: {label} -> {response.text[:300]}")
                return
        try:
            case.validate_response(response, checks=CHECKS + extra_checks)
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collected, reported together below
            failures.append(f"schema: {label} -> {response.status_code} {response.text[:200]}\n  {exc}")

    def run(strategy, examples: int, extra_checks=()) -> None:
        @settings(
            max_examples=examples,
            phases=[Phase.explicit, Phase.generate],
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=False,
        )
        @given(strategy)
        def drive(case):
            run_one(case, list(extra_checks))

        try:
            drive()
        except Unsatisfiable:
            pass  # e.g. negative data for an operation without inputs: nothing to make invalid

    for op in operations:
        run(op.as_strategy(generation_mode=GenerationMode.POSITIVE), EXAMPLES["positive"])
        if op.path_parameters or op.query or op.body:  # else there is nothing to make invalid
            run(
                op.as_strategy(generation_mode=GenerationMode.NEGATIVE),
                EXAMPLES["negative"],
                [negative_data_rejection],
            )
    # The success paths: real ids, a matching selector, real engine routes.
    for op in operations:
        params = {}
        path = op.path
        if "{worker_id}" in path:
            params["worker_id"] = victim["worker_id"] if op.method.upper() in ("DELETE", "PUT") else wid
        if path.startswith("/v1/rl/operations/"):
            params["id"] = op_id
        elif "{id}" in path:
            params["id"] = wid
        kwargs = {"path_parameters": params} if params else {}
        if "{path}" in path:
            for route in ENGINE_ROUTES:
                query = {"selector": "engine=sglang"} if path.startswith("/v1/rl/engine/") else None
                run(
                    op.as_strategy(
                        path_parameters={**params, "path": route}, **({"query": query} if query else {})
                    ),
                    max(1, EXAMPLES["real"] // 2),
                )
        elif params or op.method.upper() in ("GET", "HEAD"):
            run(op.as_strategy(**kwargs), EXAMPLES["real"])

    print(
        f"schemathesis: {stats['requests']} requests over {len(operations)} operations, "
        f"statuses {dict(sorted(stats['statuses'].items()))}, mirrored engine 5xx {stats['mirrored_5xx']}"
    )
    assert failures == [], f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    assert stats["requests"] >= 200
    # The run reached the success paths, not only refusals.
    assert stats["statuses"].get(200, 0) > 20 and stats["statuses"].get(202, 0) > 0
