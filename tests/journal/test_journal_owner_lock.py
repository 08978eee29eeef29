"""The journal's ownership lock (``journal/lock.py``): one owner per file, released by the kernel
when the owner dies, owner details for the refusal, room for a shared mode. Real files and a real
child process (SIGKILLed by its PID)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from journal import JournalLock, JournalLocked, SqliteStore
from journal.lock import lock_path, read_owners


def test_a_second_exclusive_owner_is_refused_with_the_owners_details(tmp_path):
    path = str(tmp_path / "j.db")
    with JournalLock.acquire(path, version="9.9") as first:
        first.update(port=31234)
        with pytest.raises(JournalLocked) as refused:
            JournalLock.acquire(path)
        owner = refused.value.owners[0]
        assert (owner.pid, owner.host, owner.port, owner.mode) == (
            os.getpid(),
            socket.gethostname(),
            31234,
            "exclusive",
        )
        text = str(refused.value)
        assert f"pid {os.getpid()}" in text and "port 31234" in text and f"since {owner.since}" in text
        assert owner.since.endswith("Z")
    # Released: the next owner gets it and the file now describes the new owner only.
    with JournalLock.acquire(path) as again:
        assert [o.pid for o in read_owners(lock_path(path))] == [os.getpid()]
        assert again.owner.port is None


CHILD = textwrap.dedent(
    """
    import sys, time
    from journal import JournalLock
    group = sys.argv[3] if len(sys.argv) > 3 else ""
    lock = JournalLock.acquire(sys.argv[1], mode=sys.argv[2], group=group)
    lock.update(port=4242)
    print("locked", flush=True)
    time.sleep(60)
    """
)


def holder(path: str, mode: str, group: str = "") -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, mode, group], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "locked"
    return child


def stop(child: subprocess.Popen) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)


def test_a_sigkilled_owner_does_not_block_the_next_one(tmp_path):
    path = str(tmp_path / "j.db")
    child = holder(path, "exclusive")
    try:
        with pytest.raises(JournalLocked) as refused:
            JournalLock.acquire(path)
        assert refused.value.owners[0].pid == child.pid and refused.value.owners[0].port == 4242
        stop(child)  # SIGKILL: no cleanup code runs in the owner
    finally:
        stop(child)
    # No stale row, no PID file to clean: the kernel released the lock with the process.
    with JournalLock.acquire(path) as lock:
        assert lock.held


def test_shared_holders_coexist_and_keep_an_exclusive_owner_out(tmp_path):
    path = str(tmp_path / "j.db")
    # One line per process in the lock file: a holder here and one in a child process.
    mine = JournalLock.acquire(path, mode="shared", port=1, group="g1")
    child = holder(path, "shared", "g1")
    try:
        with pytest.raises(JournalLocked) as refused:
            JournalLock.acquire(path)
        assert sorted((o.port, o.mode) for o in refused.value.owners) == [(1, "shared"), (4242, "shared")]
    finally:
        mine.release()
        stop(child)
    with JournalLock.acquire(path), pytest.raises(JournalLocked):
        JournalLock.acquire(path, mode="shared", group="g1")


def test_a_shared_holder_of_another_group_is_refused_until_the_group_is_gone(tmp_path):
    # Two `--workers N` launches on one file: the second group's processes opt in to sharing too,
    # but they are not part of the first group, so they are refused, naming the first group.
    path = str(tmp_path / "j.db")
    child = holder(path, "shared", "group-a")
    try:
        with pytest.raises(JournalLocked) as refused:
            JournalLock.acquire(path, mode="shared", group="group-b")
        assert [(o.pid, o.group) for o in refused.value.owners] == [(child.pid, "group-a")]
        with JournalLock.acquire(path, mode="shared", group="group-a") as member:
            assert member.held  # a member of the same group joins
        stop(child)  # SIGKILL: its line stays in the file, but the process is gone
    finally:
        stop(child)
    with JournalLock.acquire(path, mode="shared", group="group-b") as lock:
        assert [o.group for o in read_owners(lock_path(path))] == ["group-b"]
        assert lock.held


def test_shared_mode_needs_a_group_and_exclusive_takes_none(tmp_path):
    path = str(tmp_path / "j.db")
    with pytest.raises(ValueError):
        JournalLock.acquire(path, mode="shared")
    with pytest.raises(ValueError):
        JournalLock.acquire(path, group="g")


def test_the_lock_never_touches_sqlites_own_locks(tmp_path):
    # SQLite locks the database file with POSIX fcntl locks, which a process loses when it closes
    # ANY descriptor of that file. The lock lives in a sidecar file, and the identity flock on the
    # database file uses a descriptor that is never closed (it is parked on release), so writers
    # and readers of the journal work as before while the owner holds it.
    path = str(tmp_path / "j.db")
    with JournalLock.acquire(path):
        store = SqliteStore.open(path)
        reader = SqliteStore.open(path, readonly=True)
        assert reader.last_seq() == 0
        reader.close()
        store.close()
    assert os.path.exists(lock_path(path)) and oct(os.stat(lock_path(path)).st_mode & 0o777) == "0o600"


def test_an_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError):
        JournalLock.acquire(str(tmp_path / "j.db"), mode="sometimes")


def test_what_the_lock_file_says_is_escaped_before_it_is_printed(tmp_path):
    path = str(tmp_path / "j.db")
    with JournalLock.acquire(path) as held:
        forged = json.dumps(
            {"mode": "exclusive", "pid": 7, "host": "h\x1b]0;owned\x07", "port": 1, "since": "now\r"}
        )
        with open(lock_path(path), "w") as f:
            f.write(forged + "\n")
        with pytest.raises(JournalLocked) as refused:
            JournalLock.acquire(path)
        text = str(refused.value)
        assert "\x1b" not in text and "\x07" not in text and "\r" not in text
        assert "h\\x1b]0;owned\\x07" in text
        assert held.held


def test_a_symlink_to_the_journal_is_the_same_journal(tmp_path):
    # Found against live gateways: `launch --journal link.db` (link.db -> j.db) beside a live owner
    # of j.db started a second gateway on the same file (the lock was link.db.lock).
    path = tmp_path / "j.db"
    SqliteStore.open(str(path)).close()
    (tmp_path / "link.db").symlink_to(path)
    (tmp_path / "dir").symlink_to(tmp_path)
    with JournalLock.acquire(str(path)):
        for other in (tmp_path / "link.db", tmp_path / "dir" / "j.db", tmp_path / "dir" / "link.db"):
            with pytest.raises(JournalLocked):
                JournalLock.acquire(str(other))
    with JournalLock.acquire(str(tmp_path / "link.db")), pytest.raises(JournalLocked):  # and back
        JournalLock.acquire(str(path))
    assert lock_path(str(tmp_path / "link.db")) == str(path) + ".lock"


def test_a_hard_link_to_the_journal_in_another_directory_is_the_same_journal(tmp_path):
    # Found by reading the code: `launch --journal other/j.db` where other/j.db is a hard link to a
    # live gateway's journal took other/j.db.lock, so a second gateway ran on the same file (with
    # its own -wal and -shm: a corrupted WAL). The lock follows the file's identity too.
    path = tmp_path / "j.db"
    SqliteStore.open(str(path)).close()
    (tmp_path / "other").mkdir()
    link = tmp_path / "other" / "j.db"
    os.link(path, link)
    with JournalLock.acquire(str(path)):
        with pytest.raises(JournalLocked) as refused:
            JournalLock.acquire(str(link))
        assert "another path" in str(refused.value)
        # The refused attempt released the sidecar lock it had taken beside the link.
        assert read_owners(lock_path(str(link))) == []
    # Released: the link may own it now, and the path not.
    with JournalLock.acquire(str(link)), pytest.raises(JournalLocked):
        JournalLock.acquire(str(path))
    # The journal is still a journal: the locks never wrote a byte of it or broke SQLite's locks.
    store = SqliteStore.open(str(path))
    assert store.last_seq() == 0
    store.close()


def test_the_identity_lock_holds_across_processes_and_dies_with_its_owner(tmp_path):
    path = str(tmp_path / "j.db")
    (tmp_path / "other").mkdir()
    SqliteStore.open(path).close()
    link = str(tmp_path / "other" / "j.db")
    os.link(path, link)
    child = holder(link, "exclusive")
    try:
        with pytest.raises(JournalLocked):
            JournalLock.acquire(path)
    finally:
        stop(child)
    with JournalLock.acquire(path) as lock:
        assert lock.held
