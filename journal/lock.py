"""One owner per journal file: an OS lock on the sidecar file ``<journal>.lock``.

Two gateways on one journal each keep their own fleet and mark the other's operations
interrupted, so ``smgrl launch`` takes this lock before it opens the journal and refuses at once,
naming the owner, when another process holds it. Readers (``smgrl journal ...``, ``verify``,
``compact``) never take it: SQLite's own locking keeps them safe beside the owner.

Why a sidecar file and ``flock(2)``:

* SQLite locks the database file with POSIX ``fcntl`` locks. Those belong to the *process* and are
  all dropped when the process closes *any* descriptor of that file, so a lock of ours on the
  database file (opened and closed by us) could silently release SQLite's. ``flock`` locks on a
  separate file never interact with them.
* A ``flock`` lock belongs to the open file description and the kernel releases it when the
  process dies, SIGKILL included: a crashed owner never blocks a restart, and there is no stale
  row or PID file to clean up (the file's content is only a description, never the lock).
* The file is never deleted or replaced: a new inode at the same path would let a second process
  lock "the journal" while the first still holds the old inode.

The sidecar is named after the path, and a hard link to the journal in another directory is
another path (with its own ``-wal`` and ``-shm`` files: two gateways there would corrupt the WAL).
So the lock also follows the file's identity: ``flock`` on a descriptor of the journal file itself,
which every link and every path to that inode shares. That descriptor is never closed while the
process runs (closing would drop SQLite's POSIX locks, see above): on release the ``flock`` is
undone with ``LOCK_UN`` and the descriptor is parked, to be reused by the next lock on the same
file (at most one parked descriptor per journal file and concurrent holder in a process).

The content is one JSON object per holder, one per line, describing who holds it: ``mode``,
``pid``, ``host``, ``port`` (``null`` until the gateway listens), ``since`` (UTC), ``version``.
It is written right after the lock is taken and rewritten once the port is known.

Modes. ``exclusive`` (``LOCK_EX``) is what a lone ``smgrl launch`` takes. ``shared`` (``LOCK_SH``)
is for several processes serving one journal together (``--workers N``): every process of such a
group declares the same ``group`` (an opaque token its supervisor chose, e.g. a uuid passed to
each worker), holds the lock shared and adds its own line; the kernel then refuses an exclusive
launcher while any of them runs and refuses them while an exclusive owner runs. A shared holder
of ANOTHER group is refused too: after taking ``LOCK_SH`` it reads the lines (under the record
lock that serializes rewrites), drops those of processes of this host that are dead (a SIGKILLed
member leaves its line), and refuses when a live line names another group. Within a group,
SQLite's write lock (``BEGIN IMMEDIATE`` per batch) serializes the appends: journal/store.py.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import threading
from typing import Any, Self

import attrs

from .errors import JournalError

__all__ = ["MODES", "JournalLock", "JournalLocked", "Owner", "lock_path", "read_owners"]

MODES = {"exclusive": fcntl.LOCK_EX, "shared": fcntl.LOCK_SH}
_MAX_RECORD_BYTES = 64 * 1024  # the file is only ever a few lines; never read more than this


def lock_path(journal_path: str) -> str:
    """``<journal>.lock`` beside the file the path resolves to: a symlink to the journal (or to a
    directory on its path) names the same lock, so it cannot start a second owner. A hard link
    in another directory names another lock file; the ``flock`` on the journal file itself
    (:func:`_identity_fd`) refuses it."""
    return os.path.realpath(os.fspath(journal_path)) + ".lock"


# Descriptors of journal files whose flock was released, by (st_dev, st_ino): never closed (see
# the module docstring), reused by the next lock on the same file.
_parked: dict[tuple[int, int], list[int]] = {}
_parked_lock = threading.Lock()


def _identity_fd(journal_path: str) -> int:
    """A descriptor of the journal file (created empty if missing, as SQLite would), reusing a
    parked one of the same file. Never one a live :class:`JournalLock` holds: ``flock`` conflicts
    only between open file descriptions, and a second holder in this process must be refused too."""
    fd = os.open(journal_path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    with _parked_lock:
        spare = _parked.get((st.st_dev, st.st_ino))
        reused = spare.pop() if spare else None
    if reused is None:
        return fd
    # A second descriptor of the same file was just opened: park it instead of closing it.
    _park(fd)
    return reused


def _park(fd: int) -> None:
    st = os.fstat(fd)
    with _parked_lock:
        _parked.setdefault((st.st_dev, st.st_ino), []).append(fd)


@attrs.frozen
class Owner:
    """Who holds the lock, as its holder described itself."""

    mode: str
    pid: int
    host: str
    port: int | None
    since: str
    version: str = ""
    group: str = ""  # shared mode: the cooperating group's token ('' for exclusive)

    def describe(self) -> str:
        port = "not listening yet" if self.port is None else f"port {self.port}"
        return f"pid {self.pid} on {self.host}, {port}, since {self.since} ({self.mode})"

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, line: str) -> Owner | None:
        try:
            data = json.loads(line)
            return cls(
                mode=_printable(data["mode"]),
                pid=int(data["pid"]),
                host=_printable(data["host"]),
                port=None if data.get("port") is None else int(data["port"]),
                since=_printable(data["since"]),
                version=_printable(data.get("version", "")),
                group=_printable(data.get("group", "")),
            )
        except (ValueError, TypeError, KeyError):
            return None


# Not smgrl.core.printable.escape: the journal package sits below smgrl and imports nothing of it.
def _printable(value: object, limit: int = 200) -> str:
    """Anyone who can write the lock file chooses these strings, and they reach a terminal:
    control characters are escaped, length bounded."""
    text = str(value)[:limit]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class JournalLocked(JournalError):
    """Another process owns the journal. ``owners`` is what the lock file says about it."""

    code = "journal_locked"

    def __init__(self, journal_path: str, owners: list[Owner], *, through: str = "") -> None:
        self.journal_path = journal_path
        self.owners = owners
        if owners:
            who = "; ".join(o.describe() for o in owners)
        elif through:
            who = f"a gateway holding {through}"
        else:
            who = "a process that has not described itself yet"
        super().__init__(f"{journal_path} is in use by another smgrl gateway: {who}")


def read_owners(path: str) -> list[Owner]:
    """The holders a lock file describes (unreadable lines are skipped)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(_MAX_RECORD_BYTES)
    except OSError:
        return []
    return _parse(text)


def _maybe_alive(owner: Owner) -> bool:
    """False only for a process of this host that is known dead (its line is stale)."""
    if owner.host != socket.gethostname():
        return True
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, owned by someone else
    return True


def _parse(text: str) -> list[Owner]:
    return [o for o in map(Owner.parse, text.splitlines()) if o is not None]


def _take_identity(journal_path: str, mode: str) -> int:
    """The ``flock`` on the journal file itself: refuses an owner reached through another path
    (a hard link in another directory, whose sidecar lock is another file)."""
    fd = _identity_fd(journal_path)
    try:
        fcntl.flock(fd, MODES[mode] | fcntl.LOCK_NB)
    except BlockingIOError:
        _park(fd)
        raise JournalLocked(
            os.fspath(journal_path), [], through="the same file through another path (a hard link)"
        ) from None
    except BaseException:
        _park(fd)
        raise
    return fd


class JournalLock:
    """A held journal lock. Build it with :meth:`acquire`; :meth:`release` (or process death) ends it."""

    def __init__(
        self,
        path: str,
        fd: int,
        owner: Owner,
        journal_fd: int | None = None,
        *,
        journal_path: str = "",
        created: bool = False,
    ) -> None:
        self.path = path
        self._fd: int | None = fd
        self._journal_fd = journal_fd
        self._journal_path = journal_path
        self._created = created
        self.owner = owner

    @classmethod
    def acquire(
        cls,
        journal_path: str,
        *,
        mode: str = "exclusive",
        port: int | None = None,
        version: str = "",
        group: str = "",
    ) -> JournalLock:
        """Take the lock without waiting; :class:`JournalLocked` when another process holds it.

        ``mode="shared"`` needs ``group``: the token every process of one cooperating group
        declares (a holder of another group is refused). ``OSError`` when the lock file cannot be
        created (missing directory, permissions).
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if (mode == "shared") != bool(group):
            raise ValueError("a shared lock needs a group token, an exclusive one takes none")
        path = lock_path(journal_path)
        # 0600 like the journal; O_CLOEXEC (Python's default) so no child process inherits it.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, MODES[mode] | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalLocked(os.fspath(journal_path), read_owners(path)) from None
        except BaseException:
            os.close(fd)
            raise
        created = not os.path.exists(journal_path)
        try:
            journal_fd = _take_identity(journal_path, mode)
        except BaseException:
            os.close(fd)  # releases the sidecar's flock (the sidecar is not the database file)
            raise
        since = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        owner = Owner(
            mode=mode,
            pid=os.getpid(),
            host=socket.gethostname(),
            port=port,
            since=since,
            version=version,
            group=group,
        )
        lock = cls(path, fd, owner, journal_fd, journal_path=os.fspath(journal_path), created=created)
        try:
            lock._write(joining=True)
        except BaseException:
            lock.release()
            raise
        return lock

    def update(self, **changes: Any) -> None:
        """Rewrite this holder's description (e.g. ``port=`` once the gateway listens)."""
        self.owner = attrs.evolve(self.owner, **changes)
        self._write()

    def _write(self, *, joining: bool = False) -> None:
        fd = self._require_fd()
        line = self.owner.to_json() + "\n"
        if self.owner.mode == "exclusive":
            # Sole holder: the file is this one line. Written in one pwrite and then trimmed, so a
            # reader sees the old or the new description, never an empty file in between.
            data = line.encode()
            old = os.fstat(fd).st_size
            os.pwrite(fd, data + b" " * max(0, old - len(data)), 0)
            os.ftruncate(fd, len(data))
            return
        # Shared: every holder keeps its own line (a crashed holder's line stays until the next
        # exclusive owner rewrites the file; the lock itself is released by the kernel).
        # Holders rewrite the file one at a time: a POSIX record lock on the lock file (never on
        # the database: see above) serializes the read-modify-write.
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            # Read through our own descriptor: opening and closing the file again would drop this
            # process's record lock (the POSIX rule above).
            text = os.pread(fd, _MAX_RECORD_BYTES, 0).decode("utf-8", "replace")
            others = [
                o
                for o in _parse(text)
                if (o.pid, o.host) != (self.owner.pid, self.owner.host) and _maybe_alive(o)
            ]
            foreign = [o for o in others if o.group != self.owner.group]
            if joining and foreign:
                raise JournalLocked(self.path.removesuffix(".lock"), foreign)
            lines = [o.to_json() + "\n" for o in others]
            data = "".join([*lines, line]).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)

    def _require_fd(self) -> int:
        if self._fd is None:
            raise JournalError(f"{self.path} is no longer held")
        return self._fd

    def _release_identity(self, fd: int) -> None:
        """Undo the journal file's flock. The acquire created the file if it was missing (an
        identity needs a file); still empty now, nothing ever opened it as a journal (a startup
        that failed before, e.g. on a busy port): it is removed, as if never touched, and its
        descriptor closed (an empty file holds no SQLite lock to lose)."""
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        if self._created:
            try:
                st, now = os.fstat(fd), os.stat(self._journal_path)
            except OSError:
                st = now = None  # type: ignore[assignment]  # both or neither: checked below
            if st and now and st.st_size == 0 and (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                with contextlib.suppress(OSError):
                    os.unlink(self._journal_path)
                os.close(fd)
                return
        _park(fd)  # never closed: see the module docstring

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up. The file stays (see the module docstring); a sole holder empties it."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        journal_fd, self._journal_fd = self._journal_fd, None
        if journal_fd is not None:
            self._release_identity(journal_fd)
        with contextlib.suppress(OSError):
            if self.owner.mode == "exclusive":
                os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor of this open file description releases the flock

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
