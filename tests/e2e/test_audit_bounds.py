"""The journal cannot be grown by strangers (decision D2), with a real gateway process.

10,000 unauthenticated requests with 8 KB paths against a gateway with control-plane keys: every
one is refused (401) and logged, but the journal gets only counts (one small
``audit.control_plane_counts`` event per interval and at shutdown), so the file grows by less than
64 KiB, and the gateway's resident memory by less than 5% (nothing per request is kept). Memory
and bytes are asserted, never time; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import sqlite3

import trio

from smgrl.demo.procs import launch_gateway

KEY = "admin-key-0123456789"
CONNECTIONS = 8
PIPELINE = 50  # requests sent back to back on one connection before reading their answers
WARMUP = 1_000
REQUESTS = 10_000
PATH_BYTES = 8_000


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def journal_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def _connection(port: int, count: int, statuses: dict[int, int]) -> None:
    long_id = "w" * (PATH_BYTES // 2)
    request = (
        f"GET /v1/rl/workers/{long_id}/engine/{'p' * (PATH_BYTES // 2)} HTTP/1.1\r\nhost: x\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        buf = b""
        sent = 0
        while sent < count:
            n = min(PIPELINE, count - sent)
            await stream.send_all(request * n)
            sent += n
            answered = 0
            while answered < n:
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    chunk = await stream.receive_some(65536)
                    assert chunk, "the gateway closed the connection"
                    buf += chunk
                    continue
                head = buf[:head_end].decode("latin-1").lower()
                length = 0
                for line in head.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip() == "content-length":
                        length = int(value)
                while len(buf) < head_end + 4 + length:
                    chunk = await stream.receive_some(65536)
                    assert chunk, "the gateway closed the connection"
                    buf += chunk
                status = int(head.split(" ", 2)[1])
                statuses[status] = statuses.get(status, 0) + 1
                buf = buf[head_end + 4 + length :]
                answered += 1


async def _send(port: int, total: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    with trio.fail_after(120):  # a safety bound, not an assertion on speed
        async with trio.open_nursery() as nursery:
            for i in range(CONNECTIONS):
                share = total // CONNECTIONS + (1 if i < total % CONNECTIONS else 0)
                nursery.start_soon(_connection, port, share, statuses)
    return statuses


def test_unauthenticated_requests_with_long_paths_do_not_grow_the_journal_or_memory(children, tmp_path):
    journal = str(tmp_path / "journal.db")
    keys = ["--control-plane-api-keys", f"adm:admin:admin:{KEY}"]
    child, port = launch_gateway(
        ["--enable-rl", "--disable-health-check", *keys, "--journal", journal], log_dir=tmp_path
    )
    children.append(child)
    pid = child.proc.pid

    assert trio.run(_send, port, WARMUP) == {401: WARMUP}
    rss_before = rss_kib(pid)
    # Baseline: everything in the database file (the gateway is idle; it checkpoints on close too).
    with sqlite3.connect(journal) as rw:
        rw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    bytes_before = journal_bytes(journal)
    with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as ro:
        seq_before = ro.execute("SELECT max(seq) FROM events").fetchone()[0]

    assert trio.run(_send, port, REQUESTS) == {401: REQUESTS}
    rss_after = rss_kib(pid)

    assert child.stop() == 0  # the shutdown flushes the last interval's counts
    bytes_after = journal_bytes(journal)
    with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as ro:
        rows = ro.execute("SELECT type, length(payload) FROM events WHERE seq > ?", (seq_before,)).fetchall()
        counts = ro.execute("SELECT payload FROM events WHERE type = 'audit.control_plane_counts'").fetchall()
    print(
        f"rss {rss_before} -> {rss_after} KiB; journal {bytes_before} -> {bytes_after} bytes;"
        f" {len(rows)} events since, {sum(n for _, n in rows)} payload bytes"
    )
    assert rss_after < rss_before * 1.05
    assert bytes_after - bytes_before < 64 * 1024
    assert {t for t, _ in rows} <= {"audit.control_plane_counts", "gateway.stopped"}
    # Every refusal is accounted for, in counts: warm-up and the 10,000.
    denied = sum(
        c["count"]
        for (payload,) in counts
        for c in json.loads(payload)["counts"]
        if c["outcome"] == "denied" and c["principal"] == "unauthenticated"
    )
    assert denied == WARMUP + REQUESTS
    # ... and each one has its audit log line, the path cut.
    text = child.log_path.read_text()
    lines = [line for line in text.splitlines() if "control_plane_audit" in line]
    assert len(lines) == WARMUP + REQUESTS
    assert max(len(line) for line in lines) < 2_000
