"""The store contract: every test runs against SqliteStore (a tmp file), MemoryStore and PgStore
(a fresh schema on the real PostgreSQL server the ``pg_server`` fixture starts; skipped, saying
why, where no server binaries exist). The several-writers part of the contract (conditional
append, leases, change tokens) is in test_journal_shared.py, over the same three backends.

Like eventsourcing's recorder test cases: whatever the gateway, replay or the CLI may rely on is
stated here once, and every backend must pass it.
"""

from __future__ import annotations

import json

import pytest
from journal_helpers import FakeClock, a_few, finished, outcome, registered, removed, started

from journal import Append, ControlStarted, JournalReadOnlyError, Recorded, UnknownEvent
from journal._chain import chain_hash
from journal.retention import Retention
from journal.store import _PAGE
from smgrl.events import ControlOutcome, WorkerRegistered, WorkerRemoved, encode

SECRET = "sk-live-0123456789abcdef-do-not-print"


def _mixed() -> list[Append]:
    return [
        Append("workers", registered("w1", has_api_key=True), {"w1": SECRET}),
        Append("control", started("op1")),
        Append("control", outcome("op1", "w1")),
        Append("control", finished("op1")),
        Append("workers", removed("w1")),
    ]


class TestAppendAndRead:
    def test_empty_store(self, backend):
        store = backend.store
        assert store.last_seq() == 0
        assert store.count() == 0
        assert list(store.read()) == []
        assert list(store.read_raw()) == []
        assert store.verify().ok
        assert store.append_batch([]) == []

    def test_seqs_are_consecutive_and_order_is_kept(self, backend):
        store = backend.store
        first = store.append_batch(_mixed())
        second = store.append_batch(a_few(3))
        recorded = first + second
        assert [r.seq for r in recorded] == list(range(1, 9))
        assert list(store.read()) == recorded
        assert store.last_seq() == 8
        assert store.count() == 8
        assert [r.event for r in recorded[:5]] == [a.event for a in _mixed()]

    def test_one_timestamp_per_batch_never_decreasing(self, backend):
        clock = FakeClock(1000.0)
        backend.set_clock(clock)
        store = backend.store
        a = store.append_batch(a_few(3))
        clock.now = 900.0  # the clock steps back (NTP): ts is clamped, never goes backwards
        b = store.append_batch(a_few(2))
        clock.now = 1001.5
        c = store.append_batch(a_few(1))
        assert {r.ts for r in a} == {1000.0}
        assert {r.ts for r in b} == {1000.0}
        assert c[0].ts == 1001.5
        assert store.verify().ok

    def test_recorded_hash_chain_links(self, backend):
        recorded = backend.store.append_batch(_mixed())
        hashes = [r.hash for r in recorded]
        assert len(set(hashes)) == len(hashes)
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in hashes)

    def test_filters(self, backend):
        store = backend.store
        store.append_batch(_mixed())
        store.append_batch([Append("workers", registered("w2")), Append("control", outcome("op2", "w2"))])
        by_type = [r.seq for r in store.read(types=["control.outcome"])]
        assert by_type == [3, 7]
        by_class = [r.seq for r in store.read(types=[WorkerRegistered, WorkerRemoved])]
        assert by_class == [1, 5, 6]
        assert [r.seq for r in store.read(types=[])] == []
        assert [r.seq for r in store.read(stream="workers")] == [1, 5, 6]
        assert [r.seq for r in store.read(after_seq=2, limit=3)] == [3, 4, 5]
        assert [r.seq for r in store.read(until_seq=2)] == [1, 2]
        assert [r.seq for r in store.read(after_seq=1, until_seq=4, stream="control")] == [2, 3, 4]
        assert [r.seq for r in store.read(limit=0)] == []
        assert [r.seq for r in store.read(types=[ControlOutcome], stream="control", after_seq=3)] == [7]

    def test_time_window(self, backend):
        clock = FakeClock(100.0)
        backend.set_clock(clock)
        store = backend.store
        for t in (100.0, 200.0, 300.0):
            clock.now = t
            store.append_batch(a_few(2))
        assert [r.seq for r in store.read(since_ts=200.0)] == [3, 4, 5, 6]
        assert [r.seq for r in store.read(until_ts=300.0)] == [1, 2, 3, 4]
        assert [r.seq for r in store.read(since_ts=150.0, until_ts=250.0)] == [3, 4]
        assert [r.seq for r in store.read(since_ts=400.0)] == []
        assert [r.seq for r in store.read(until_ts=50.0)] == []
        assert [r.seq for r in store.read(since_ts=100.0, after_seq=3, until_seq=5)] == [4, 5]

    def test_reads_page_through_large_journals(self, backend):
        store = backend.store
        n = 2 * _PAGE + 7
        store.append_batch(a_few(n))
        assert [r.seq for r in store.read()] == list(range(1, n + 1))
        assert [r.seq for r in store.read(after_seq=_PAGE - 2, limit=_PAGE + 5)] == list(
            range(_PAGE - 1, 2 * _PAGE + 4)
        )
        assert sum(1 for _ in store.read_raw()) == n
        assert store.verify().checked == n

    def test_read_raw_gives_stored_rows(self, backend):
        store = backend.store
        recorded = store.append_batch(_mixed())
        raw = list(store.read_raw())
        assert [row[0] for row in raw] == [1, 2, 3, 4, 5]
        for row, rec, item in zip(raw, recorded, _mixed(), strict=True):
            seq, ts, stream, type_, schema, payload = row
            assert (seq, ts, stream) == (rec.seq, rec.ts, rec.stream)
            assert (type_, schema, payload) == encode(item.event)
        assert [
            row[0] for row in store.read_raw(after_seq=1, types=["control.outcome", "worker.removed"])
        ] == [3, 5]

    def test_lists_are_json_arrays_and_tuples_in_memory(self, backend):
        store = backend.store
        store.append_batch([Append("control", started("op9"))])
        payload = json.loads(next(store.read_raw())[5])
        assert payload["targets"] == [{"worker_id": "w1", "url": "http://w1:8000", "control_url": None}]
        event = next(store.read()).event
        assert isinstance(event, ControlStarted)
        assert isinstance(event.targets, tuple)


class TestSecrets:
    def test_secrets_live_apart_from_events(self, backend):
        store = backend.store
        store.append_batch(_mixed())
        store.append_batch([Append("workers", registered("w2"), {"w2": "other-key-xyz"})])
        assert store.secrets() == {"w1": SECRET, "w2": "other-key-xyz"}
        assert store.get_secret("w1") == SECRET
        assert store.get_secret("nope") is None
        dumped = backend.everything_but_secrets()
        assert SECRET not in dumped
        assert "other-key-xyz" not in dumped
        assert not any(SECRET in repr(r) for r in store.read())
        assert not any(SECRET in repr(row) for row in store.read_raw())
        assert SECRET not in repr(Append("workers", registered("w1"), {"w1": SECRET}))

    def test_replace_and_delete(self, backend):
        store = backend.store
        store.append_batch([Append("workers", registered("w1"), {"w1": "k1"})])
        store.append_batch([Append("workers", registered("w1"), {"w1": "k2"})])
        assert store.get_secret("w1") == "k2"
        store.append_batch([Append("workers", removed("w1"), {"w1": None})])
        assert store.secrets() == {}
        assert store.get_secret("w1") is None


class TestVerify:
    def test_intact_chain_verifies(self, backend):
        store = backend.store
        store.append_batch(_mixed())
        store.append_batch(a_few(10))
        report = store.verify()
        assert (report.ok, report.checked, report.first_bad_seq, report.reason) == (True, 15, None, None)
        assert store.verify(upto=4).checked == 4

    def _ten(self, backend):
        backend.store.append_batch(_mixed())
        backend.store.append_batch(a_few(5))

    def test_edited_payload_is_detected(self, backend):
        self._ten(backend)
        payload = json.loads(backend.payload(3))
        payload["status"] = 500
        backend.set_payload(3, json.dumps(payload, separators=(",", ":"), sort_keys=True))
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq, report.checked) == (False, 3, 2)
        assert "modified" in report.reason
        assert backend.store.verify(upto=2).ok

    def test_edited_timestamp_is_detected(self, backend):
        self._ten(backend)
        backend.set_ts(6, 12.5)
        assert backend.store.verify().first_bad_seq == 6

    def test_deleted_row_is_detected(self, backend):
        self._ten(backend)
        backend.delete(4)
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq) == (False, 4)
        assert "missing" in report.reason

    def test_deleted_first_row_is_detected(self, backend):
        self._ten(backend)
        backend.delete(1)
        assert backend.store.verify().first_bad_seq == 1

    def test_truncated_tail_is_detected(self, backend):
        self._ten(backend)
        backend.truncate_after(7)
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq, report.checked) == (False, 8, 7)
        assert "truncated" in report.reason
        assert backend.store.verify(upto=7).ok

    def test_undecodable_payload_is_detected_and_read_as_unknown(self, backend):
        self._ten(backend)
        backend.set_payload(5, "{not json")
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq) == (False, 5)
        assert "JSON" in report.reason
        assert [r.event for r in backend.store.read(after_seq=4, limit=1)] == [
            UnknownEvent("worker.removed", 1, "{not json")
        ]

    def test_edited_body_is_detected(self, backend):
        self._ten(backend)
        payload = json.loads(backend.payload(2))
        payload["body"] = '{"abort_all": false}'
        backend.set_payload(2, json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False))
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq) == (False, 2)
        assert "body" in report.reason

    def test_body_removed_outside_compaction_is_detected(self, backend):
        self._ten(backend)
        payload = json.loads(backend.payload(2))
        payload["body"] = None
        backend.set_payload(2, json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False))
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq) == (False, 2)
        assert "compaction" in report.reason

    def test_rows_forged_beyond_the_head_are_detected(self, backend):
        self._ten(backend)
        head = backend.store.read(after_seq=9).__next__()
        type_, schema, payload = encode(removed("w9"))
        h = chain_hash(head.hash, 11, head.ts, "workers", type_, schema, payload.encode())
        backend.forge_row((11, head.ts, "workers", type_, schema, payload, head.hash, h))
        report = backend.store.verify()
        assert (report.ok, report.first_bad_seq) == (False, 11)
        assert "beyond" in report.reason
        assert backend.store.verify(upto=10).ok

    def test_verify_while_the_journal_is_appended_to(self, backend):
        # E.g. `smgrl journal verify` while the gateway runs: rows committed during the scan are
        # newer than the verification, not forged.
        backend.store.append_batch(a_few(_PAGE + 10))
        with backend.during_scan(lambda: backend.store.append_batch(a_few(5))):
            report = backend.store.verify()
        assert report.ok, report
        assert report.checked == _PAGE + 10
        assert backend.store.verify().checked == _PAGE + 15

    def test_verify_while_bodies_are_compacted(self, backend):
        store = backend.store
        store.append_batch(a_few(_PAGE + 10))
        store.append_batch([Append("control", started(f"op{i}")) for i in range(5)])
        with backend.during_scan(lambda: store.compact_bodies(store.last_seq() + 1)):
            report = store.verify()
        assert report.ok, report
        assert all(r.event.body is None for r in store.read(types=[ControlStarted]))


class TestUnknownEvents:
    def test_unknown_type_is_preserved(self, backend):
        store = backend.store
        future = UnknownEvent("fleet.rebalanced", 2, {"moved": ["w1", "w2"], "why": "load"})
        recorded = store.append_batch([Append("fleet", future), Append("workers", removed("w1"))])
        assert [r.event for r in store.read()] == [future, removed("w1")]
        assert recorded[0].event == future
        assert next(store.read_raw())[3:] == ("fleet.rebalanced", 2, '{"moved":["w1","w2"],"why":"load"}')
        assert store.verify().ok

    def test_newer_schema_decodes_as_unknown(self, backend):
        store = backend.store
        newer = UnknownEvent("worker.removed", 99, {"worker_id": "w1", "reason": "api"})
        store.append_batch([Append("workers", newer)])
        (rec,) = store.read()
        assert rec.event == newer
        assert not isinstance(rec.event, WorkerRemoved)

    def test_payload_not_fitting_the_class_decodes_as_unknown(self, backend):
        store = backend.store
        odd = UnknownEvent("worker.removed", 1, {"worker_id": "w1"})  # "reason" is missing
        store.append_batch([Append("workers", odd)])
        assert next(store.read()).event == odd


class TestCompaction:
    def _journal(self, backend) -> list[Recorded]:
        items = [
            Append("control", started("op1", body=b'{"weights": "/ckpt/1"}')),
            Append("control", started("op2", body=b"\xff\xfe binary")),
            Append("control", started("op3", body=b"")),
            Append("control", outcome("op1")),
            Append("control", started("op4", body=b'{"weights": "/ckpt/4"}')),
        ]
        return backend.store.append_batch(items)

    def test_compaction_drops_bodies_and_keeps_the_chain(self, backend):
        store = backend.store
        before = self._journal(backend)
        assert before[1].event.body_encoding == "base64"
        assert store.compact_bodies(5) == 2  # op1 and op2; op3 had no body
        after = list(store.read())
        assert [r.hash for r in after] == [r.hash for r in before]
        assert [r.event.body for r in after if isinstance(r.event, ControlStarted)] == [
            None,
            None,
            None,
            '{"weights": "/ckpt/4"}',
        ]
        assert after[0].event.body_encoding == "utf8"  # kept: tells "compacted" from "no body"
        assert after[0].event == before[0].event.__class__(**{**_fields(before[0].event), "body": None})
        report = store.verify()
        assert report.ok, report
        assert store.compact_bodies(5) == 0  # idempotent

    def test_compaction_never_reaches_past_the_head(self, backend):
        store = backend.store
        self._journal(backend)
        assert store.compact_bodies(10_000) == 3
        store.append_batch([Append("control", started("op5"))])
        assert store.verify().ok
        payload = json.loads(backend.payload(6))
        payload["body"] = None  # a body appended after compaction, removed by hand
        backend.set_payload(6, json.dumps(payload, separators=(",", ":"), sort_keys=True))
        assert store.verify().first_bad_seq == 6

    def test_compaction_leaves_tampered_bodies_as_evidence(self, backend):
        store = backend.store
        self._journal(backend)
        payload = json.loads(backend.payload(1))
        payload["body"] = '{"weights": "/evil"}'
        backend.set_payload(1, json.dumps(payload, separators=(",", ":"), sort_keys=True))
        assert store.compact_bodies(6) == 2  # op2 and op4, not the tampered op1
        report = store.verify()
        assert (report.ok, report.first_bad_seq) == (False, 1)


def _fields(ev):
    import attrs

    return attrs.asdict(ev, recurse=False)


class TestSnapshots:
    def test_save_and_load_latest(self, backend):
        store = backend.store
        store.append_batch(a_few(5))
        assert store.latest_snapshot("registry") is None
        store.save_snapshot("registry", 0, "{}")
        store.save_snapshot("registry", 3, '{"n": 3}')
        store.save_snapshot("registry", 5, '{"n": 5}')
        store.save_snapshot("refits", 4, "[]")
        assert store.latest_snapshot("registry") == (5, '{"n": 5}')
        assert store.latest_snapshot("registry", max_seq=4) == (3, '{"n": 3}')
        assert store.latest_snapshot("registry", max_seq=0) == (0, "{}")
        assert store.latest_snapshot("refits") == (4, "[]")
        assert store.latest_snapshot("other") is None

    def test_bad_snapshots_are_refused(self, backend):
        store = backend.store
        store.append_batch(a_few(2))
        with pytest.raises(ValueError):
            store.save_snapshot("registry", 3, "{}")  # no such event
        with pytest.raises(ValueError):
            store.save_snapshot("registry", 1, "{not json")

    def test_tampered_snapshot_is_skipped(self, backend):
        store = backend.store
        store.append_batch(a_few(4))
        store.save_snapshot("registry", 2, '{"n": 2}')
        store.save_snapshot("registry", 4, '{"n": 4}')
        backend.set_snapshot_state(4, '{"n": 400}')
        assert store.latest_snapshot("registry") == (2, '{"n": 2}')

    def test_snapshot_of_rewritten_history_is_skipped(self, backend):
        store = backend.store
        store.append_batch(a_few(4))
        store.save_snapshot("registry", 4, '{"n": 4}')
        backend.truncate_after(3)
        assert store.latest_snapshot("registry") is None


class TestReadOnly:
    def test_readonly_reads_but_never_writes(self, backend):
        store = backend.store
        store.append_batch(_mixed())
        store.save_snapshot("registry", 5, "{}")
        ro = backend.readonly()
        try:
            assert list(ro.read()) == list(store.read())
            assert ro.verify().ok
            assert ro.latest_snapshot("registry") == (5, "{}")
            with pytest.raises(JournalReadOnlyError):
                ro.append_batch(a_few(1))
            with pytest.raises(JournalReadOnlyError):
                ro.save_snapshot("registry", 5, "{}")
            with pytest.raises(JournalReadOnlyError):
                ro.compact_bodies(5)
            store.append_batch(a_few(1))  # the writer goes on; the reader sees it
            assert ro.last_seq() == 6
        finally:
            ro.close()
        assert store.count() == 6
        assert store.verify().ok


def test_snapshots_are_thinned_by_the_retention_policy(backend):
    store = backend.store
    store.append_batch(a_few(40))
    policy = Retention(every=1, recent=8, per_level=2)
    taken: set[int] = set()
    for seq in range(1, 41):
        dropped = store.save_snapshot("fleet", seq, f'{{"n": {seq}}}', retention=policy)
        kept = policy.keep(taken | {seq}, 40)
        assert sorted(dropped) == sorted(taken - kept)  # every drop is reported
        taken = kept
    store.save_snapshot("other", 2, "{}", retention=policy)
    assert store.latest_snapshot("fleet") == (40, '{"n": 40}')
    assert store.latest_snapshot("fleet", max_seq=35) == (35, '{"n": 35}')  # recent: all kept
    assert len(taken) < 40  # older ones thinned
    for target in range(1, 41):
        found = store.latest_snapshot("fleet", max_seq=target)
        assert (found[0] if found else 0) == max((s for s in taken if s <= target), default=0)
    assert store.latest_snapshot("other") == (2, "{}")
