"""Fault injection with real processes on loopback: a real `smgrl launch`, real fake-engine
processes, real sockets. Each test is bounded (every wait has a deadline; timeouts are safety bounds,
never assertions): statuses, error codes, journal records and memory are what is asserted.

- an engine killed (SIGKILL) mid-fan-out: 207 naming it, the others answered, the journal has it;
- an engine that accepts and never answers: upstream_timeout at the deadline, the rest finishes;
- an engine that streams a 1 GiB body: the envelope is cut at 1 MiB, the gateway's memory stays flat;
- a client that sends its body byte by byte: answered correctly, nobody else waits for it;
- a client that disconnects mid-fan-out: engine calls cancelled (their connections close), the
  journal records `cancelled`;
- the journal's disk full (a real tmpfs, filled): 503 journal_unavailable with no engine called,
  reads keep working, recovery when space returns, `smgrl journal verify` passes;
- SIGTERM during a fan-out: the fan-out completes and is journaled, the process exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import trio

from journal import MemoryStore, SqliteStore
from smgrl.core.config import Config, HealthConfig, RlConfig
from smgrl.demo.procs import free_port, start_fake_engines, wait_for_workers
from smgrl.fake import fake_fleet
from smgrl.registry.health import HealthChecker
from smgrl.registry.service import Registration
from smgrl.testing import gateway_in_process

FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"
BOUND = 30.0  # seconds: the safety bound of every wait below


# -- helpers -----------------------------------------------------------------------------------------


def fake(url: str, method: str, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, method=method, headers={"content-type": "application/json"} if data else {}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def knobs(url: str, **values) -> None:
    fake(url, "POST", "/_fake/knobs", values)


def calls(url: str, path: str) -> list[dict]:
    return fake(url, "GET", f"/_fake/calls?path={path}")["calls"]


def state(url: str) -> dict:
    return fake(url, "GET", "/_fake/state")


def gateway_connections(url: str) -> int:
    """Connections open to a fake engine, not counting the one asking."""
    return state(url)["connections"]["open"] - 1


def wait_until(predicate, what: str, bound: float = BOUND, every: float = 0.02):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"not within {bound:g}s: {what}")


class Background:
    """One HTTP request in a thread (the test meanwhile injects the fault)."""

    def __init__(self, http, method: str, path: str, body=b""):
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(http, method, path, body), daemon=True)
        self.thread.start()

    def _run(self, http, method, path, body):
        try:
            self.result = http.request(method, path, body)
        except BaseException as exc:  # noqa: BLE001 - re-raised in join()
            self.error = exc

    def join(self, bound: float = BOUND):
        self.thread.join(bound)
        assert not self.thread.is_alive(), "the request did not finish within the bound"
        if self.error is not None:
            raise self.error
        return self.result


def vm(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident) of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0])
    return out


def by_url(rows: list[dict]) -> dict[str, dict]:
    return {r["url"]: r for r in rows}


def journal_events(http, types: set[str]) -> list[dict]:
    """Every event of these types, paging through GET /v1/rl/journal (bounded)."""
    out, after = [], 0
    for _ in range(1000):
        st, _, page = http.request("GET", f"/v1/rl/journal?after={after}&limit=1000")
        assert st == 200
        out += [e for e in page["events"] if e["type"] in types]
        after = page["next_after"]
        if not page["more"]:
            return out
    raise AssertionError("journal paging did not end")


# -- an engine killed mid-fan-out --------------------------------------------------------------------


def test_engine_killed_mid_fanout_is_named_and_the_others_are_unaffected(fakes, gateway, children):
    a, b = fakes("sglang", 2)
    victim_proc, (c,) = start_fake_engines("sglang", 1)
    children.append(victim_proc)
    gw, http, _ = gateway(
        "--enable-rl", "--disable-health-check", "--rl-control-timeout-secs", "30", "--worker-urls", a, b, c
    )
    ids = {r["url"]: r["id"] for r in wait_for_workers(http.base, 3, child=gw)}
    for url in (a, b, c):
        knobs(url, latency_ms=1500)
    call = Background(http, "POST", FANOUT)
    wait_until(lambda: calls(c, "/flush_cache"), "the victim received its call")
    victim_proc.kill()  # SIGKILL, by PID, mid-call
    status, headers, body = call.join()

    assert status == 207
    assert body["total"] == 3 and body["succeeded"] == 2
    assert sorted(body["results"]) == sorted([ids[a], ids[b]])
    assert all(body["results"][ids[u]]["status"] == 200 for u in (a, b))
    (failed,) = body["failed"]
    assert (failed["worker_id"], failed["url"], failed["error"]) == (ids[c], c, "upstream_unreachable")

    # The journal recorded the failure, and the others' outcomes.
    st, _, op = http.request("GET", f"/v1/rl/operations/{headers['x-smgrl-operation-id']}")
    assert st == 200 and op["result"] == "partial" and op["http_status"] == 207
    outcomes = {t["worker_id"]: t["outcome"] for t in op["targets"]}
    assert outcomes[ids[c]]["error"] == "upstream_unreachable"
    assert outcomes[ids[a]]["status"] == outcomes[ids[b]]["status"] == 200

    # Control calls touch no breaker and no load: the others stay healthy and callable at once.
    st, _, listed = http.request("GET", "/workers")
    rows = by_url(listed["workers"])
    for url in (a, b):
        assert rows[url]["is_healthy"] is True and rows[url]["load"] == 0
    for url in (a, b):
        knobs(url, latency_ms=0)
    sel = f"url in ({a},{b})".replace(":", "%3A").replace("/", "%2F").replace(" ", "%20").replace(",", "%2C")
    st, _, again = http.request("POST", f"/v1/rl/engine/flush_cache?selector={sel}", b"")
    assert st == 200 and again["succeeded"] == 2


# -- an engine that accepts and never answers --------------------------------------------------------


def test_hung_engine_times_out_and_the_rest_of_the_fanout_finishes(fakes, gateway):
    urls = fakes("sglang", 3)
    gw, http, _ = gateway(
        "--enable-rl", "--disable-health-check", "--rl-control-timeout-secs", "1", "--worker-urls", *urls
    )
    ids = {r["url"]: r["id"] for r in wait_for_workers(http.base, 3, child=gw)}
    hung = urls[1]
    knobs(hung, hang=True)
    status, headers, body = http.request("POST", FANOUT, b"")
    assert status == 207 and body["succeeded"] == 2
    (failed,) = body["failed"]
    assert failed == {
        "worker_id": ids[hung],
        "url": hung,
        "error": "upstream_timeout",
        "message": f"upstream `{hung}` timed out after 1s",
    }
    assert sorted(body["results"]) == sorted(ids[u] for u in urls if u != hung)
    st, _, op = http.request("GET", f"/v1/rl/operations/{headers['x-smgrl-operation-id']}")
    assert op["result"] == "partial"
    assert {t["worker_id"]: t["outcome"]["error"] for t in op["targets"]}[ids[hung]] == "upstream_timeout"
    # The per-worker route answers 504 with the error envelope.
    st, _, one = http.request("POST", f"/v1/rl/workers/{ids[hung]}/engine/flush_cache", b"")
    assert st == 504 and one["error"] == "upstream_timeout" and one["worker_id"] == ids[hung]
    knobs(hung, hang=False)
    st, _, body = http.request("POST", FANOUT, b"")
    assert st == 200


# -- an engine that streams a 1 GiB body -------------------------------------------------------------

GIB = 1 << 30
MIB = 1 << 20


def test_a_1_gib_engine_answer_is_cut_at_1_mib_and_memory_stays_flat(fakes, gateway, record_property):
    urls = fakes("sglang", 2)
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    ids = {r["url"]: r["id"] for r in wait_for_workers(http.base, 2, child=gw)}
    # Warm up the paths (first-call allocations are not growth).
    http.request("POST", f"/v1/rl/workers/{ids[urls[0]]}/engine/flush_cache", b"")
    http.request("POST", FANOUT, b"")
    before = vm(gw.pid)
    for _ in range(3):
        knobs(urls[0], huge_body_bytes=GIB)
        st, _, env = http.request("POST", f"/v1/rl/workers/{ids[urls[0]]}/engine/flush_cache", b"")
        assert st == 200 and env["body_truncated"] is True
        assert isinstance(env["body"], str) and len(env["body"].encode()) == MIB
        assert env["body"].startswith('{"pad":"xxx')
    for url in urls:  # both targets of a fan-out at once
        knobs(url, huge_body_bytes=GIB)
    st, _, fan = http.request("POST", FANOUT, b"")
    assert st == 200 and all(r["body_truncated"] is True for r in fan["results"].values())
    after = vm(gw.pid)
    rss_growth = (after["VmRSS"] - before["VmRSS"]) / 1024
    peak_growth = (after["VmHWM"] - before["VmHWM"]) / 1024
    record_property("rss_growth_mib", round(rss_growth, 1))
    record_property("peak_growth_mib", round(peak_growth, 1))
    print(
        f"1 GiB answers x5: VmRSS {before['VmRSS'] // 1024} -> {after['VmRSS'] // 1024} MiB, "
        f"VmHWM {before['VmHWM'] // 1024} -> {after['VmHWM'] // 1024} MiB"
    )
    # 5 GiB went past the gateway; a buffered answer would show as +1 GiB of peak resident memory.
    assert peak_growth < 64, peak_growth
    assert rss_growth < 32, rss_growth
    # The engines stopped sending: the gateway closed those connections after 1 MiB.
    assert all(gateway_connections(u) <= 1 for u in urls)


# -- a slow client ------------------------------------------------------------------------------------


def test_a_client_sending_its_body_byte_by_byte_is_served_and_blocks_nobody(fakes, gateway):
    (url,) = fakes("sglang", 1)
    gw, http, port = gateway("--enable-rl", "--disable-health-check", "--worker-urls", url)
    (row,) = wait_for_workers(http.base, 1, child=gw)
    body = json.dumps({"pad": "x" * 24, "n": 1}).encode()
    head = (
        f"POST /v1/rl/workers/{row['id']}/engine/flush_cache HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as sock:
        sock.sendall(head)
        others = 0
        for i, byte in enumerate(body):
            sock.sendall(bytes([byte]))
            time.sleep(0.02)
            if i % 6 == 0:  # meanwhile, other clients are served at once
                st, _, _ = http.request("GET", "/v1/rl/workers")
                assert st == 200
                others += 1
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw) < raw.index(b"\r\n\r\n") + 4 + _length(raw):
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    status_line = raw.partition(b"\r\n")[0]
    assert status_line.startswith(b"HTTP/1.1 200")
    envelope = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert envelope["worker_id"] == row["id"] and envelope["status"] == 200
    assert others == len(range(0, len(body), 6))
    (received,) = calls(url, "/flush_cache")
    assert received["body"] == body.decode()  # every byte arrived, in order, once


def _length(raw: bytes) -> int:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            return int(line.split(":", 1)[1])
    return 0


# -- a client that disconnects mid-fan-out ------------------------------------------------------------


def test_client_disconnect_cancels_engine_calls_and_is_journaled(fakes, gateway):
    urls = fakes("sglang", 3)
    gw, http, port = gateway(
        "--enable-rl", "--disable-health-check", "--rl-control-timeout-secs", "60", "--worker-urls", *urls
    )
    ids = {r["url"]: r["id"] for r in wait_for_workers(http.base, 3, child=gw)}
    fast, hung = urls[0], urls[1:]
    for url in hung:
        knobs(url, hang=True)
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as sock:
        sock.sendall(f"POST {FANOUT} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n".encode())
        wait_until(lambda: all(calls(u, "/flush_cache") for u in urls), "every engine received its call")
        during = [gateway_connections(u) for u in hung]
        assert all(n >= 1 for n in during)
    # The client is gone: the gateway cancels the calls in flight, closing their connections.
    wait_until(lambda: all(gateway_connections(u) == 0 for u in hung), "the hung engines' connections closed")

    def finished():
        found = journal_events(http, {"control.finished"})
        return [e for e in found if e["payload"]["result"] == "cancelled"]

    (event,) = wait_until(finished, "control.finished cancelled in the journal")
    st, _, op = http.request("GET", f"/v1/rl/operations/{event['payload']['op_id']}")
    assert st == 200 and op["result"] == "cancelled" and op["http_status"] == 499
    outcomes = {t["worker_id"]: t["outcome"] for t in op["targets"]}
    assert outcomes[ids[fast]]["status"] == 200
    assert all(outcomes[ids[u]] is None for u in hung)
    assert sorted(op["missing_targets"]) == sorted(ids[u] for u in hung)
    for url in hung:
        knobs(url, hang=False)
    assert http.request("POST", FANOUT, b"")[0] == 200


# -- the journal's disk full ---------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A small tmpfs mounted at ``path`` (needs root and CAP_SYS_ADMIN; skips otherwise)."""
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path) -> int:
    """Write a filler file until the filesystem refuses (ENOSPC); return its size."""
    written = 0
    chunk = b"\0" * 65536
    with open(os.path.join(path, "filler"), "wb", buffering=0) as f:
        for _ in range(100_000):  # bounded: 6 GiB at most, far above any tmpfs used here
            try:
                written += f.write(chunk)
            except OSError:
                break
    for size in (4096, 512, 1):  # the last partial blocks too
        with open(os.path.join(path, "filler"), "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                written += f.write(b"\0" * size)
    return written


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a tmpfs")
def test_journal_disk_full_refuses_calls_keeps_reads_and_recovers(fakes, gateway, tmp_path):
    urls = fakes("sglang", 2)
    with tmpfs(tmp_path / "disk", "16m") as disk:
        journal = str(disk / "journal.db")
        gw, http, port = gateway(
            "--enable-rl", "--disable-health-check", "--worker-urls", *urls, journal=journal
        )
        ids = [r["id"] for r in wait_for_workers(http.base, 2, child=gw)]
        st, headers, _ = http.request("POST", FANOUT, b"")
        assert st == 200
        done_op = headers["x-smgrl-operation-id"]
        calls_before = sum(len(calls(u, "/flush_cache")) for u in urls)
        # A registration that stays pending (nothing listens there): its job keeps probing and
        # recording each failed probe, also while the disk is full.
        st, _, _ = http.request("POST", "/workers", {"url": f"http://127.0.0.1:{free_port()}/pending"})
        assert st == 202

        filled = fill(disk)
        assert filled > 0
        # The journal cannot take the record: 503, and no engine is called.
        for path in (FANOUT, f"/v1/rl/workers/{ids[0]}/engine/flush_cache"):
            st, headers, body = http.request("POST", path, b"")
            assert st == 503 and body["error"] == "journal_unavailable", (st, body)
            assert "x-smgrl-operation-id" not in headers
        assert sum(len(calls(u, "/flush_cache")) for u in urls) == calls_before
        # Reads keep working: discovery, the registry, the journal routes.
        assert http.request("GET", "/v1/rl/workers")[0] == 200
        assert http.request("GET", "/workers")[0] == 200
        st, _, op = http.request("GET", f"/v1/rl/operations/{done_op}")
        assert st == 200 and op["result"] == "ok"
        st, _, page = http.request("GET", "/v1/rl/journal?limit=1000")
        assert st == 200 and page["events"]
        # A registry write cannot be journaled either: refused with a 503, nothing changed; and the
        # pending registration's probe records fail: neither may take the gateway down.
        st, _, body = http.request("PATCH", f"/workers/{ids[0]}", {"labels": {"during": "full"}})
        assert (st, body["code"]) == (503, "JOURNAL_UNAVAILABLE")
        # The pending registration's job fails to record a probe, and retries: twice logged means
        # it survived the first failure (before the fix the error took the gateway down).
        log = tmp_path / f"gateway-{port}.log"
        wait_until(
            lambda: log.read_text().count("journal unavailable during discovery") >= 2,
            "the registration job failed to record a probe and retried",
        )
        assert gw.proc.poll() is None, "the gateway died on a full disk"

        # Space returns: the next operation is journaled and the engines are called again.
        os.remove(disk / "filler")
        st, headers, body = http.request("POST", FANOUT, b"")
        assert st == 200 and body["succeeded"] == 2
        recovered_op = headers["x-smgrl-operation-id"]
        assert "x-smgrl-journal" not in headers
        st, _, op = http.request("GET", f"/v1/rl/operations/{recovered_op}")
        assert st == 200 and op["result"] == "ok"
        assert gw.stop() == 0

        # Nothing already journaled was corrupted: the chain verifies, every operation is whole.
        verify = subprocess.run(
            [sys.executable, "-m", "smgrl", "journal", "--journal", journal, "verify"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        store = SqliteStore.open(journal, readonly=True)
        try:
            report = store.verify()
            assert report.ok, report
            finished = {r.event.op_id: r.event.result for r in store.read(types=["control.finished"])}
            assert finished[done_op] == "ok" and finished[recovered_op] == "ok"
        finally:
            store.close()


# -- SIGTERM during a fan-out ---------------------------------------------------------------------------


def test_sigterm_mid_fanout_lets_it_finish_journals_it_and_exits_0(fakes, gateway, tmp_path):
    urls = fakes("sglang", 2)
    journal = str(tmp_path / "sigterm.db")
    gw, http, _ = gateway(
        "--enable-rl",
        "--disable-health-check",
        "--shutdown-grace-period-secs",
        "30",
        "--worker-urls",
        *urls,
        journal=journal,
    )
    wait_for_workers(http.base, 2, child=gw)
    for url in urls:
        knobs(url, latency_ms=1500)
    call = Background(http, "POST", FANOUT)
    wait_until(lambda: all(calls(u, "/flush_cache") for u in urls), "the engines received the calls")
    gw.proc.send_signal(signal.SIGTERM)
    status, headers, body = call.join()
    assert status == 200 and body["succeeded"] == 2
    assert gw.proc.wait(BOUND) == 0
    op_id = headers["x-smgrl-operation-id"]
    # A clean stop leaves a self-contained file: the .db alone (no -wal) holds every event.
    alone = str(tmp_path / "copy-of-the-db-file-only.db")
    shutil.copyfile(journal, alone)
    store = SqliteStore.open(alone, readonly=True)
    try:
        events = [r.event for r in store.read()]
    finally:
        store.close()
    finished = [e for e in events if getattr(e, "op_id", None) == op_id and e.TYPE == "control.finished"]
    assert [(e.result, e.http_status, e.succeeded) for e in finished] == [("ok", 200, 2)]
    assert not [e for e in events if e.TYPE == "control.interrupted"]
    stopped = [e for e in events if e.TYPE == "gateway.stopped"]
    assert stopped and stopped[-1].clean is True


# -- the journal failing, in process (a store whose commits fail like a full disk) ----------------------


class FailingStore(MemoryStore):
    """Commits fail with ENOSPC while ``full`` is set, as SQLite's do on a full disk.
    ``refused``: the event types of every batch it refused, in order."""

    full = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.refused: list[str] = []

    def append_batch(self, items, *, wait=None):
        if self.full:
            self.refused += [item.event.TYPE for item in items]
            raise OSError(28, "No space left on device")
        return super().append_batch(items, wait=wait)


def _cfg(**kw):
    return Config(
        rl=RlConfig(enabled=True),
        registration_backoff_initial_secs=0.05,
        registration_backoff_max_secs=0.1,
        **kw,
    )


async def test_discovery_and_health_checks_survive_a_failing_journal():
    """A registration job or a health check whose record cannot be written retries later; before
    the fix, the JournalWriteError escaped the job and cancelled the gateway's whole nursery."""
    store = FailingStore()
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(_cfg(), store=store) as gw:
        (wid,) = await gw.register(fleet.urls)
        closed = free_port()
        await gw.gateway.registry.register(Registration(url=f"http://127.0.0.1:{closed}"), "api")
        checker = HealthChecker(
            fleet=gw.gateway.fleet,
            registry=gw.gateway.registry,
            pools=gw.gateway.pools,
            keys=gw.gateway.keys,
            cfg=HealthConfig(failure_threshold=1, success_threshold=1),
        )
        store.full = True
        fleet.engines[0].go_down(None)  # unhealthy: the checker wants to record it and cannot
        await checker.check_once()
        assert "worker.health_changed" in store.refused  # the checker tried to record it
        # The pending registration's probes fail and cannot be recorded either; its job retries.
        with trio.fail_after(BOUND):
            while store.refused.count("worker.probe_failed") < 2:
                await trio.sleep(0.01)
        assert gw.gateway.fleet.registry.get(wid).status == "ready"  # unchanged: nothing recorded
        store.full = False
        await checker.check_once()  # the next round records it
        assert gw.gateway.fleet.registry.get(wid).status == "not_ready"
        fleet.engines[0].come_up()
        assert (await gw.client.get("/v1/rl/workers")).status_code == 200


async def test_registry_writes_answer_503_when_the_journal_cannot_record_them():
    """(They answered 500 internal_error before: found by the disk-full test.)"""
    store = FailingStore()
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(_cfg(), store=store) as gw:
        (wid,) = await gw.register(fleet.urls)
        store.full = True
        statuses = [
            (await gw.client.post("/workers", json={"url": "http://127.0.0.1:1"})).status_code,
            (await gw.client.patch(f"/workers/{wid}", json={"labels": {"a": "b"}})).status_code,
            (await gw.client.delete(f"/workers/{wid}")).status_code,
        ]
        assert statuses == [503, 503, 503], statuses
        r = await gw.client.put(f"/workers/{wid}", json={"url": "http://127.0.0.1:1", "labels": {}})
        assert r.status_code == 503 and r.json()["code"] == "JOURNAL_UNAVAILABLE"
        store.full = False
        assert (await gw.client.patch(f"/workers/{wid}", json={"labels": {"a": "b"}})).status_code == 202


async def test_disk_full_after_the_engines_were_called_answers_with_x_smgrl_journal_unavailable():
    """The start record is written, then the disk fills: the engines' answers are not hidden, the
    response says the record is missing, and the operation stays open in the journal (a restart
    records it interrupted)."""
    store = FailingStore()
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(_cfg(), store=store) as gw:
        await gw.register(fleet.urls)
        for engine in fleet.engines:
            engine.set_knobs(latency_ms=300)
        answers = []

        async def call():
            answers.append(await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            with trio.fail_after(BOUND):
                while not all(e.calls_to("/flush_cache") for e in fleet.engines):
                    await trio.sleep(0.01)
            store.full = True  # control.started is durable; control.finished will not be
        (r,) = answers
        assert r.status_code == 200 and r.json()["succeeded"] == 2
        assert r.headers["x-smgrl-journal"] == "unavailable"
        op_id = r.headers["x-smgrl-operation-id"]
        store.full = False
        types = [rec.event.TYPE for rec in store.read(stream=f"op:{op_id}")]
        assert types == ["control.started"]  # the outcomes were in the failed batch too
        assert gw.gateway.fleet.operations.get(op_id).result is None  # still open
    async with gateway_in_process(_cfg(), store=store) as gw2:  # a restart on the same journal
        r = await gw2.client.get(f"/v1/rl/operations/{op_id}")
        assert r.status_code == 200 and r.json()["result"] == "interrupted"


# -- an answer sent before the request body arrived ------------------------------------------------------


def _close_wait(port: int) -> int:
    """Sockets in CLOSE-WAIT on this local port (the peer left, we did not close): /proc/net/tcp*."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "08":
                    count += 1
    return count


def test_an_answer_sent_before_the_body_arrived_never_wedges_the_connection(fakes, gateway):
    """A POST whose body comes in a second segment (as urllib3/requests send it) and is answered
    before the body is read (unknown URL, wrong method, auth refusal...): the gateway must then
    either serve the next request on that connection or close it. It did neither (hypercorn's
    close ran in the app's cancelled task): the next request hung forever and the connection
    leaked even after the client left. Found by the schemathesis run."""
    (url,) = fakes("sglang", 1)
    gw, http, port = gateway("--enable-rl", "--disable-health-check", "--worker-urls", url)
    wait_for_workers(http.base, 1, child=gw)
    body = b'{"a": 1}'
    outcomes = []
    for path in ("/nope", "/v1/rl/nope", "/health", "/v1/rl/workers"):  # 404, 404, 405, 405
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n".encode())
            first = sock.recv(65536)
            assert first.split(b" ")[1] in (b"404", b"405"), first[:40]
            time.sleep(0.02)
            try:
                sock.sendall(body)  # the body arrives after the answer
                time.sleep(0.02)
                sock.sendall(b"GET /v1/rl/workers HTTP/1.1\r\nhost: x\r\n\r\n")
                second = sock.recv(65536)  # an answer, or b"" (closed): never a timeout
            except (BrokenPipeError, ConnectionResetError):
                second = b""
            outcomes.append("closed" if second == b"" else second.split(b"\r\n")[0].decode())
    assert all(o in ("closed", "HTTP/1.1 200 ") for o in outcomes), outcomes
    # Nothing left half-open on the gateway's side once the clients are gone.
    wait_until(lambda: _close_wait(port) == 0, "no CLOSE-WAIT connection left on the gateway")
    # And the way clients really do it: one keep-alive session, an early 404, then more requests.
    requests = pytest.importorskip("requests")
    with requests.Session() as session:
        for _ in range(3):
            assert session.post(f"http://127.0.0.1:{port}/nope", json={"a": 1}, timeout=10).status_code == 404
            assert session.get(f"http://127.0.0.1:{port}/v1/rl/workers", timeout=10).status_code == 200
