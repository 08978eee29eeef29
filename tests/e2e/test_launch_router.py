"""smgrl launched the way PSRL launches its gateways: ``launch_router(RouterArgs.from_cli_args(ns))``
in a daemon ``multiprocessing.Process`` (PSRL 19c0474 psrl/workers/gen/rollout_gateway.py:17-33,
126-134), alive after 3 s, a rollout gateway and a reward gateway at once without colliding.

The namespaces are PSRL's ``build_rollout_router_args`` and ``build_reward_router_args``
(PSRL 19c0474 psrl/workers/gen/smg_adapter.py:47-192) with every config lookup at its default,
written from reading them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from smgrl.demo.procs import free_port
from smgrl.launch_router import RouterArgs, plan

READY_SECS = 30.0


def rollout_namespace(host: str, port: int, ps_manager_addr: str, log_dir: str | None) -> argparse.Namespace:
    return argparse.Namespace(
        host=host,
        port=port,
        dp_aware=True,
        connection_mode="grpc",
        pd_disaggregation=False,
        prefill=None,
        decode=None,
        policy="request_num_balance",
        prefill_policy=None,
        decode_policy=None,
        disable_retries=True,
        cache_threshold=0.3,
        gpu_overlap_weight=1.0,
        lmcache_overlap_weight=0.5,
        balance_abs_threshold=64,
        balance_rel_threshold=1.5,
        balance_token_usage_threshold=1.0,
        overload_token_usage_threshold=1.0,
        enable_kv_admission_control=False,
        kv_capacity_threshold=1.0,
        eviction_interval_secs=60,
        max_tree_size=2**26,
        block_size=16,
        max_concurrent_seqs_per_instance=1024,
        cost_model_path=None,
        max_num_waiting_reqs_after_preemption=1000,
        delta_throughput_threshold=0.5,
        max_prompt_length=8192,
        request_budget=1024,
        enable_routing_loop=True,
        routing_loop_check_interval_ms=10,
        routing_loop_request_sort_key="short_length",
        routing_loop_multi_priority_queue=False,
        routing_loop_dispatch_batch_size=1,
        worker_selection_strategy="psrl",
        psrl_ps_manager_addr=ps_manager_addr,
        psrl_candidate_sort_key="version",
        psrl_enable_group_sticky=True,
        psrl_kv_transfer_enable=False,
        psrl_kv_transfer_mode="async",
        psrl_kv_transfer_timeout_ms=30000,
        enable_tito=True,
        tito_debug=False,
        tito_gc_threshold=None,
        trajectory_id_strategy="manual",
        multimodal_tensor_transport="auto",
        multimodal_shm_min_bytes=64 * 1024,
        service_discovery=False,
        prometheus_port=None,
        request_timeout_secs=2**64 - 1,
        log_level="warn",
        log_dir=log_dir,
        api_key=None,
        disable_health_check=True,
    )


def reward_namespace(
    host: str, port: int, prometheus_port: int | None, log_dir: str | None
) -> argparse.Namespace:
    return argparse.Namespace(
        host=host,
        port=port,
        dp_aware=False,
        connection_mode="grpc",
        pd_disaggregation=False,
        prefill=None,
        decode=None,
        policy="round_robin",
        prefill_policy=None,
        decode_policy=None,
        disable_retries=True,
        max_concurrent_seqs_per_instance=1024,
        cost_model_path=None,
        max_num_waiting_reqs_after_preemption=1000,
        delta_throughput_threshold=0.5,
        max_prompt_length=32768,
        request_budget=1024,
        enable_routing_loop=False,
        worker_selection_strategy="naive",
        service_discovery=False,
        prometheus_port=prometheus_port,
        request_timeout_secs=2**64 - 1,
        log_level="warn",
        log_dir=log_dir,
        api_key=None,
        disable_health_check=True,
    )


def _run_smg(args):
    """PSRL's process target, as PSRL writes it: the import inside, the args pickled over."""
    from smgrl.launch_router import launch_router as run

    run(args)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _send(req: urllib.request.Request) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _await_serving(proc: multiprocessing.Process, base: str) -> None:
    """Poll GET /liveness until it answers (bounded), failing at once if the process died."""
    deadline = time.monotonic() + READY_SECS
    while time.monotonic() < deadline:
        if not proc.is_alive():
            raise AssertionError(f"the gateway process exited (code {proc.exitcode})")
        try:
            if _get(base + "/liveness") == 200:
                return
        except OSError:
            pass
        proc.join(0.05)  # returns early only if the process exits
    raise AssertionError(f"{base} did not serve within {READY_SECS:g}s")


def _start(args: RouterArgs) -> multiprocessing.Process:
    proc = multiprocessing.Process(target=_run_smg, args=(args,), daemon=True)
    proc.start()
    return proc


def _alive_at_3s(proc: multiprocessing.Process, started: float) -> None:
    """PSRL's check (sleep 3 s, assert alive): here a join bounded at the 3 s mark, which returns
    early only if the process dies, so a crash in the window fails the test."""
    proc.join(max(0.0, started + 3.0 - time.monotonic()))
    assert proc.is_alive(), f"exited with {proc.exitcode}"


@pytest.fixture
def ps_manager():
    """A fake PSManager in a process of its own (grpcio threads must not be forked with the
    gateways)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "smgrl.fake.psmanager", "--port", "0", "--aborted", "9"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # the fake prints its address once serving
        yield json.loads(line)["addr"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def launched():
    procs: list[multiprocessing.Process] = []
    yield procs
    for proc in procs:
        if proc.is_alive():
            proc.terminate()  # PSRL's shutdown_router: terminate, then join
        proc.join(20)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def test_rollout_and_reward_gateways_launch_as_psrl_launches_them(
    tmp_path, monkeypatch, fakes, launched, ps_manager
):
    monkeypatch.setenv("SMGRL_JOURNAL_DIR", str(tmp_path / "journals"))
    # PSRL's rollout gateway enables TITO and names no tokenizer: nothing is exported, sessions
    # take the one the gRPC workers serve (docs/psrl.md, enable_tito).
    monkeypatch.delenv("SMGRL_TOKENIZER_PATH", raising=False)
    logs = tmp_path / "logs"
    rollout_port, reward_port, reward_metrics = free_port(), free_port(), free_port()
    rollout_args = RouterArgs.from_cli_args(
        rollout_namespace("127.0.0.1", rollout_port, ps_manager, str(logs)), use_router_prefix=False
    )
    reward_args = RouterArgs.from_cli_args(
        reward_namespace("127.0.0.1", reward_port, reward_metrics, str(logs)), use_router_prefix=False
    )
    assert plan(rollout_args).config.prometheus_port is None  # no metrics listener
    started = time.monotonic()
    rollout, reward = _start(rollout_args), _start(reward_args)
    launched += [rollout, reward]
    rollout_base, reward_base = f"http://127.0.0.1:{rollout_port}", f"http://127.0.0.1:{reward_port}"
    _await_serving(rollout, rollout_base)
    _await_serving(reward, reward_base)
    _alive_at_3s(rollout, started)
    _alive_at_3s(reward, started)

    # Serving: an engine registered on each gateway answers a rollout through it.
    (engine,) = fakes("sglang", 1)
    for base in (rollout_base, reward_base):
        assert _post(base + "/workers", {"url": engine})[0] in (200, 202)
        deadline = time.monotonic() + READY_SECS
        status, body = 0, None
        while time.monotonic() < deadline:
            status, body = _post(base + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
            if status == 200:
                break
            time.sleep(0.1)  # registration is asynchronous: poll (bounded) until it routes
        assert status == 200, body
    # A rollout with PSRL's routing metadata takes the staged selection and asks PSManager.
    req = urllib.request.Request(
        rollout_base + "/generate",
        data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode(),
        headers={"content-type": "application/json", "x-request-id": "7", "x-prompt-id": "3"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and r.headers["x-version-tag"] is not None
    # ... and PSManager's answers count: a request it reports aborted is not dispatched.
    req.remove_header("X-request-id")
    req.add_header("x-request-id", "9")
    status, body = _send(req)
    assert (status, body["error"]["code"]) == (400, "request_aborted")
    assert _get(f"http://127.0.0.1:{reward_metrics}/metrics") == 200
    # TITO is on without a tokenizer: the registered engine (HTTP) serves none, so a session turn
    # is the retryable 503 that says what is missing, not a disabled route.
    status, created = _post(rollout_base + "/sessions", {})
    assert status in (200, 201), created
    turn = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body = _post(f"{rollout_base}/sessions/{created['session_id']}/v1/chat/completions", turn)
    assert (status, body["error"]["code"]) == (503, "tokenizer_unavailable"), body

    # No collision: a journal file and a log file of its own per gateway.
    journals = sorted(p.name for p in (tmp_path / "journals").glob("*.db"))
    assert sorted(n.split("-")[1] for n in journals) == sorted([str(rollout_port), str(reward_port)])
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        [f"smgrl-gateway-{rollout_port}.log", f"smgrl-gateway-{reward_port}.log"]
    )


def test_a_field_smgrl_cannot_honour_stops_the_launch_naming_it(launched):
    ns = reward_namespace("127.0.0.1", free_port(), None, None)
    ns.pd_disaggregation = True
    proc = _start(RouterArgs.from_cli_args(ns))
    launched.append(proc)
    proc.join(READY_SECS)
    assert proc.exitcode == 1
