"""A real PostgreSQL server on loopback for the tests and benchmarks (nothing mocked).

``PgServer.start()`` runs ``initdb`` and ``postgres`` from the system's PostgreSQL binaries
(``/usr/lib/postgresql/*/bin``, or ``initdb`` on PATH; ``SMGRL_PG_BIN`` names another directory)
in a fresh temp dir, on a free 127.0.0.1 port, with password (scram) authentication so every URL
carries a password, and waits until it accepts connections (polling with a bounded deadline).
PostgreSQL refuses to run as root: as root, the server runs as an unprivileged user (``nobody``,
or ``smgrl-test`` created with useradd if ``nobody`` is missing) that owns the temp dir.
``stop()`` ends it by PID (fast shutdown, then SIGKILL) and removes the dir.

``unavailable()`` says why the server cannot run here (no binaries, no psycopg), or None.
.ci/run installs the binaries (apt-get install postgresql) and pyproject's test extra psycopg.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time

_DEADLINE = 60.0


def bin_dir() -> str | None:
    env = os.environ.get("SMGRL_PG_BIN")
    if env:
        return env if os.path.exists(os.path.join(env, "postgres")) else None
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[-3].split(".")[0])
    )
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def unavailable() -> str | None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    if bin_dir() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql, or set SMGRL_PG_BIN)"
    return None


def _run_as() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    for name in ("nobody", "smgrl-test"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    subprocess.run(["useradd", "--system", "--no-create-home", "smgrl-test"], check=True)
    entry = pwd.getpwnam("smgrl-test")
    return entry.pw_uid, entry.pw_gid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self) -> None:
        self.dir = ""
        self.port = 0
        self.password = "pw-" + secrets.token_hex(12)
        self.proc: subprocess.Popen | None = None

    def url(self, schema: str | None = None, *, database: str = "postgres") -> str:
        base = f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{database}"
        return base + (f"?schema={schema}" if schema else "")

    def start(self) -> PgServer:
        bindir = bin_dir()
        assert bindir is not None, unavailable()
        ids = _run_as()
        self.dir = tempfile.mkdtemp(prefix="smgrl-pg-")
        data = os.path.join(self.dir, "data")
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as f:
            f.write(self.password + "\n")
        kw: dict = {}
        if ids is not None:
            for path in (self.dir, pwfile):
                os.chown(path, *ids)
            kw = {"user": ids[0], "group": ids[1], "extra_groups": []}
        subprocess.run(
            [
                f"{bindir}/initdb",
                "-D",
                data,
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **kw,
        )
        self._bindir, self._kw = bindir, kw
        last_error = None
        for _attempt in range(3):  # a free port may be taken by another test run in between
            self.port = _free_port()
            self._spawn()
            last_error = self._wait_ready()
            if last_error is None:
                return self
            self._kill()
        self.stop()
        raise RuntimeError(f"PostgreSQL did not start: {last_error}")

    def _spawn(self) -> None:
        log = open(os.path.join(self.dir, "postgres.log"), "ab")  # noqa: SIM115 - lives with the server
        self.proc = subprocess.Popen(
            [
                f"{self._bindir}/postgres",
                "-D",
                os.path.join(self.dir, "data"),
                "-p",
                str(self.port),
                "-k",
                self.dir,
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=log,
            **self._kw,
        )
        log.close()

    def restart(self, *, immediate: bool = True) -> None:
        """Stop the server and start it again on the same port and data directory. Immediate
        mode (SIGQUIT) ends every backend at once without a checkpoint, as a crash would; the
        next start runs crash recovery. Returns once it accepts connections again."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGQUIT if immediate else signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        for _attempt in range(50):  # the port is ours; an old backend may hold it a moment longer
            self._spawn()
            error = self._wait_ready()
            if error is None:
                return
            self._kill()
            time.sleep(0.1)  # bounded by the attempts: the old postmaster's socket is going away
        raise RuntimeError(f"PostgreSQL did not restart: {error}")

    def _wait_ready(self) -> str | None:
        import psycopg

        deadline = time.monotonic() + _DEADLINE
        error = "timeout"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                with open(os.path.join(self.dir, "postgres.log"), "rb") as f:
                    return f"postgres exited {self.proc.returncode}: {f.read()[-500:]!r}"
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return None
            except psycopg.OperationalError as exc:
                error = str(exc)
            time.sleep(0.05)  # polling interval while the server starts (bounded by the deadline)
        return error

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)

    def stop(self) -> None:
        self._kill()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""
