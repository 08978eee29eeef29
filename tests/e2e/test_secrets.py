"""No key ever leaks (architecture.md, "Secrets apart"): a session with known keys runs through real
processes, then every place smgrl writes is searched for the key strings:

- the journal FILE: every row of every table except `secrets`, and the raw bytes of a copy with the
  `secrets` rows deleted and the file vacuumed (so free pages and indexes are searched too);
- the gateway's logs, as text and as `--log-json`;
- `/metrics`;
- every HTTP answer of the session (bodies and headers);
- every `smgrl journal ...` subcommand's output (stdout, stderr and files it writes), with and
  without `--json`; the subcommands are read from `smgrl journal --help`, so a new one is searched
  as soon as it exists.

Keys: an admin and a user control-plane key, a tenant key, the `--api-key` (which is also the
bearer smgrl sends to the `--worker-urls` engines, and in the second run the control-plane
credential), a worker api_key given at registration, and a guessed key an attacker sends.
The engines really require their keys (fake engines started with `--api-key`), so a missing or
wrong bearer would show as failed calls.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from smgrl.cli.main import cli
from smgrl.demo.procs import free_port, start_fake_engines, start_gateway, wait_for_workers, wait_listening

ADMIN = "adm-S3cr3t-2b6e1f"
USER = "usr-S3cr3t-9c3d2a"
TENANT = "tnt-S3cr3t-41f0e7"
API_KEY = "api-S3cr3t-77aa10"  # --api-key: the --worker-urls engines' bearer; run 2: the control credential
WORKER = "wrk-S3cr3t-5e5e5e"  # a worker's registration api_key
GUESS = "gss-S3cr3t-0d0d0d"  # what an attacker tries
PASSWORD = "pwd-S3cr3t-1a2b3c"  # in a worker URL's userinfo: refused, never echoed
SECRETS = {
    "password": PASSWORD,
    "admin": ADMIN,
    "user": USER,
    "tenant": TENANT,
    "api_key": API_KEY,
    "worker": WORKER,
    "guess": GUESS,
}
FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"


def _leaks(text: str | bytes, where: str) -> list[str]:
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return [f"{name} key in {where}" for name, key in SECRETS.items() if key.encode() in data]


class Recorder:
    """A stdlib client keeping every answer (status, headers, raw body) for the search."""

    def __init__(self, base: str, token: str | None = None, seen: list | None = None):
        self.base, self.token = base, token
        self.seen = seen if seen is not None else []

    def as_(self, token: str | None) -> Recorder:
        return Recorder(self.base, token, self.seen)

    def request(self, method, path, body=None, headers=None):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        hdrs = {"content-type": "application/json"} if data is not None else {}
        if self.token:
            hdrs["authorization"] = f"Bearer {self.token}"
        hdrs.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, answer_headers, raw = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, answer_headers, raw = e.code, dict(e.headers), e.read()
        self.seen.append(
            f"{method} {path} {status} {json.dumps(answer_headers)} {raw.decode('utf-8', 'replace')}"
        )
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        return status, answer_headers, parsed


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """Two gateway runs on one journal, with every kind of key in play; returns what to search."""
    work = tmp_path_factory.mktemp("secrets")
    journal = str(work / "journal.db")
    children = []
    seen: list[str] = []
    metrics: list[str] = []
    logs = [work / "gateway-text.log", work / "gateway-json.log"]
    try:
        p1, (keyed_by_cli,) = start_fake_engines("sglang", 1, ["--api-key", API_KEY])
        p2, (keyed_by_api,) = start_fake_engines("sglang", 1, ["--api-key", WORKER])
        children += [p1, p2]

        # Run 1: control-plane keys, tenant keys, --api-key; text logs.
        port, mport = free_port(), free_port()
        with open(logs[0], "w") as log:
            gw = start_gateway(
                [
                    "--enable-rl",
                    "--disable-health-check",
                    "--journal",
                    journal,
                    "--prometheus-port",
                    str(mport),
                    "--control-plane-api-keys",
                    f"adm:Admin:admin:{ADMIN}",
                    f"usr:User:user:{USER}",
                    "--tenant-api-key",
                    f"t1:{TENANT}",
                    "--api-key",
                    API_KEY,
                    "--log-level",
                    "debug",
                    "--worker-urls",
                    keyed_by_cli,
                ],
                port=port,
                log=log,
            )
            children.append(gw)
            base = f"http://127.0.0.1:{port}"
            wait_listening(base, child=gw)
            anon = Recorder(base, seen=seen)
            admin, user = anon.as_(ADMIN), anon.as_(USER)
            st, _, reg = admin.request("POST", "/workers", {"url": keyed_by_api, "api_key": WORKER})
            assert st == 202
            # A password in the URL: refused with a pointer to api_key, echoed nowhere.
            with_password = keyed_by_api.replace("://", f"://trainer:{PASSWORD}@")
            st, _, refused = admin.request("POST", "/workers", {"url": with_password})
            assert st == 400 and "api_key" in refused["error"], refused
            rows = wait_for_workers(base, 2, token=ADMIN, child=gw)
            ids = {r["url"]: r["id"] for r in rows}
            assert user.request("GET", "/v1/rl/workers")[0] == 200
            assert user.request("GET", "/workers")[0] == 200
            assert user.request("GET", f"/workers/{reg['worker_id']}")[0] == 200
            # The engines demand their keys: 200 proves each got its own bearer.
            st, hdrs, fan = admin.request("POST", FANOUT, b"{}")
            assert st == 200 and fan["succeeded"] == 2, fan
            op_id = hdrs["x-smgrl-operation-id"]
            for url in (keyed_by_cli, keyed_by_api):
                assert admin.request("POST", f"/v1/rl/workers/{ids[url]}/engine/flush_cache", b"{}")[0] == 200
                assert admin.request("GET", f"/v1/rl/workers/{ids[url]}/engine/server_info")[0] == 200
            assert (
                admin.request("PATCH", f"/workers/{reg['worker_id']}", {"labels": {"role": "policy"}})[0]
                == 202
            )
            assert user.request("GET", f"/v1/rl/operations/{op_id}")[0] == 200
            assert user.request("GET", "/v1/rl/journal?limit=1000")[0] == 200
            # Refusals, each carrying a key somewhere it does not belong.
            assert user.request("POST", FANOUT, b"{}")[0] == 403
            for token in (TENANT, GUESS, WORKER, API_KEY):
                assert anon.as_(token).request("GET", "/v1/rl/workers")[0] == 401
                assert anon.as_(token).request("POST", FANOUT, b"{}")[0] == 401
            for raw in (ADMIN, f"Basic {ADMIN}", f"Bearer {GUESS} {ADMIN}", f"Token {WORKER}"):
                assert anon.request("GET", "/workers", headers={"authorization": raw})[0] == 401
            # An engine that refuses the bearer it got (registered with a wrong key on purpose).
            st, _, bad = admin.request("POST", "/workers", {"url": keyed_by_api + "/", "api_key": GUESS})
            assert st == 202
            metrics.append(_metrics(mport))
            assert gw.stop() == 0

        # Run 2: the same journal, --api-key as the control credential, JSON logs.
        port, mport = free_port(), free_port()
        with open(logs[1], "w") as log:
            gw = start_gateway(
                [
                    "--enable-rl",
                    "--disable-health-check",
                    "--journal",
                    journal,
                    "--prometheus-port",
                    str(mport),
                    "--api-key",
                    API_KEY,
                    "--tenant-api-key",
                    f"t1:{TENANT}",
                    "--log-json",
                    "--log-level",
                    "debug",
                    "--worker-urls",
                    keyed_by_cli,
                ],
                port=port,
                log=log,
            )
            children.append(gw)
            base = f"http://127.0.0.1:{port}"
            wait_listening(base, child=gw)
            anon = Recorder(base, seen=seen)
            shared = anon.as_(API_KEY)
            wait_for_workers(base, 2, token=API_KEY, child=gw)
            st, _, fan = shared.request("POST", FANOUT, b"{}")
            assert st == 207 and fan["succeeded"] == 2  # the wrongly keyed registration gets the engine's 401
            assert anon.as_(GUESS).request("GET", "/v1/rl/workers")[0] == 401
            assert anon.as_(TENANT).request("GET", "/workers")[0] == 401
            assert anon.as_(ADMIN).request("GET", "/workers")[0] == 401  # run 1's key means nothing here
            assert shared.request("DELETE", f"/workers/{bad['worker_id']}")[0] == 202
            for route in ("/v1/rl/journal?limit=1000", "/workers", "/v1/rl/workers", "/openapi.json"):
                assert shared.request("GET", route)[0] == 200
            metrics.append(_metrics(mport))
            assert gw.stop() == 0
    finally:
        for child in reversed(children):
            child.stop()
    return {
        "journal": journal,
        "seen": seen,
        "metrics": metrics,
        "logs": logs,
        "work": work,
        "op_id": op_id,
        "worker_id": reg["worker_id"],
        "engine": keyed_by_api,
    }


def test_the_journal_file_holds_no_key_outside_the_secrets_table(session):
    journal = session["journal"]
    # Positive control: the worker keys ARE in the file (the secrets table), so the search works.
    # (The .db alone: a clean stop moves the WAL into it.)
    with open(journal, "rb") as f:
        raw = f.read()
    assert WORKER.encode() in raw
    copy = str(session["work"] / "scrubbed.db")
    src = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    dst = sqlite3.connect(copy)
    src.backup(dst)  # includes anything still in the WAL
    src.close()
    stored = dict(dst.execute("SELECT worker_id, api_key FROM secrets").fetchall())
    assert WORKER in stored.values() and API_KEY in stored.values()
    problems = []
    tables = [t for (t,) in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert "events" in tables
    for table in tables:
        if table == "secrets":
            continue
        for row in dst.execute(f'SELECT * FROM "{table}"'):
            problems += _leaks(repr(row), f"table {table}")
    problems += _leaks(repr(dst.execute("SELECT * FROM sqlite_master").fetchall()), "the schema")
    dst.execute("DELETE FROM secrets")
    dst.commit()
    dst.execute("VACUUM")
    dst.close()
    with open(copy, "rb") as f:
        problems += _leaks(f.read(), "the file's bytes (secrets rows deleted, vacuumed)")
    assert problems == []


def test_logs_text_and_json_hold_no_key(session):
    problems = []
    for path in session["logs"]:
        text = path.read_text()
        assert "control_plane_audit" in text and "rl.fanout" in text  # the session was logged
        problems += _leaks(text, path.name)
    json_lines = [line for line in session["logs"][1].read_text().splitlines() if line.startswith("{")]
    assert json_lines and all(json.loads(line) for line in json_lines)
    assert problems == []


def test_metrics_and_http_answers_hold_no_key(session):
    problems = []
    for text in session["metrics"]:
        assert "smg_rl_fanout_total" in text
        problems += _leaks(text, "/metrics")
    assert len(session["seen"]) > 30
    for answer in session["seen"]:
        problems += _leaks(answer, "an HTTP answer")
    assert problems == []


def _journal_cli(*args: str) -> subprocess.CompletedProcess:
    """`smgrl journal ARGS`, in process through click's runner (the same code and output as the
    console script, without a Python start-up per command; one real process run is below)."""
    result = CliRunner().invoke(cli, ["journal", *args], prog_name="smgrl", catch_exceptions=True)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def _subcommands(prefix: list[str]) -> list[tuple[list[str], str]]:
    """(command path, its --help text) for every (sub)command `smgrl journal --help` lists."""
    done = _journal_cli(*prefix, "--help")
    if done.returncode != 0:
        return []
    out = []
    listed = done.stdout.split("Commands:", 1)
    if len(listed) == 2:
        for line in listed[1].splitlines():
            m = re.match(r"^  (\S+)\s", line)
            if m:
                out.append((prefix + [m.group(1)], _journal_cli(*prefix, m.group(1), "--help").stdout))
                out += _subcommands(prefix + [m.group(1)])
    return out


def _invocations(command: list[str], help_text: str, values: dict[str, str], work) -> list[list[str]]:
    """Arguments for one subcommand: its positional arguments and required options filled from
    `values` by metavar, FILE options pointed at files in `work` (searched too)."""
    usage = help_text.split("\n", 1)[0]
    positional = [
        tok.strip("[].")
        for tok in usage.split("[OPTIONS]", 1)[-1].split()
        if tok.strip("[].") not in ("COMMAND", "ARGS", "")
    ]
    args = [values.get(p, values["ID"]) for p in positional]
    optional_args = []
    for line in help_text.splitlines():
        m = re.match(r"^\s+(?:-\w, )?(--[\w-]+)(?: ([A-Z][A-Z_|]*))?\s", line)
        if not m or m.group(1) in ("--journal", "--json", "--help"):
            continue
        option, metavar = m.group(1), m.group(2)
        if metavar == "FILE":
            optional_args += [option, str(work / f"{'-'.join(command)}{option}.out")]
        elif "[required]" in line and metavar:
            args += [option, values.get(metavar, values["SEQ"])]
    # (--follow is never passed: every invocation must end by itself)
    return [args, args + ["--json"]] + ([args + optional_args] if optional_args else [])


def test_every_journal_command_output_holds_no_key(session):
    commands = _subcommands([])
    if not commands:
        pytest.skip("`smgrl journal` is not available in this build")
    work = session["work"] / "cli"
    work.mkdir(exist_ok=True)
    journal = str(work / "journal.db")
    shutil.copy(session["journal"], journal)  # compact and replay --snapshot write: use a copy
    values = {
        "SEQ": "1",
        "SEQ|TIME": "1",
        "ID": session["op_id"],
        "OP_ID": session["op_id"],
        "ENGINE": session["engine"],
        "ID|URL": session["worker_id"],
        "WORKER": session["worker_id"],
        "TIME": "2000-01-01T00:00:00Z",
    }
    problems, ran = [], []
    for command, help_text in commands:
        if "Commands:" in help_text and command[-1] not in ("ops",):
            continue  # a pure group: its subcommands are run
        for args in _invocations(command, help_text, values, work):
            done = _journal_cli("--journal", journal, *command, *args)
            ran.append((" ".join(command + args), done.returncode))
            problems += _leaks(done.stdout + done.stderr, f"`smgrl journal {' '.join(command + args)}`")
    for path in work.iterdir():
        if path.suffix == ".out" and path.is_file():
            problems += _leaks(path.read_bytes(), f"file {path.name}")
    # And once as a real process, the way an operator runs it.
    done = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", journal, "export"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and session["op_id"] in done.stdout
    problems += _leaks(done.stdout + done.stderr, "`smgrl journal export` (process)")
    # A failing command fails the process too (it exited 0 before smgrl/cli/main.py passed the code on).
    missing = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", str(work / "none.db"), "verify"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 3 and "no journal at" in missing.stderr
    print("\n".join(f"{code}  smgrl journal {cmd}" for cmd, code in ran))
    assert problems == []
    # The search is only as good as the commands that ran: most must have succeeded.
    assert sum(code == 0 for _, code in ran) >= len(ran) * 0.8, ran
    assert any(cmd.startswith("export") for cmd, _ in ran) and any(cmd.startswith("events") for cmd, _ in ran)
