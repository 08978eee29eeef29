"""Every runnable example in README.md and docs/*.md, run as a user pasting it would: shell blocks
through bash (`set -euo pipefail`), Python blocks with this interpreter, console blocks with their
shown output checked, against fake engines and gateways on 127.0.0.1 (real processes).

The block convention (info strings, `no-run: REASON`, `server`, `console`) is in docblocks.py;
blocks marked not run are listed as skipped by test_docblocks.py::test_not_run (`pytest -ra`).

What the test changes, and nothing else:

- **Ports and hosts.** Each doc's addresses (`127.0.0.1:30000`, `localhost:30000`, the example
  engines `10.0.0.1:30000`, fixed fake-engine ports) are replaced by free loopback ports, per
  doc, in `SETUPS` below; console output is compared after the reverse replacement. Every
  `smgrl launch` gets `--prometheus-port <free port>` (the default 29000 is shared by every
  gateway on the host).
- **Paths.** `/tmp/ckpt/...` (the docs' checkpoint directories) and rl-control-plane.md's
  `/var/lib/smgrl/journal.db` become paths under the doc's own temporary directory, which is also
  the working directory (with `examples/` linked into it, as in a clone).
- **curl** is a shim that adds `--fail-with-body`, so an example answered with an HTTP error
  fails instead of printing an error nobody reads; console commands whose error output the doc
  shows run the real curl (the output check catches a wrong answer).
- **Fleets.** Before a doc's first block the test starts what its examples expect (`SETUPS`;
  by default a gateway with `--enable-rl`, two fake SGLang engines and the journal
  `./smgrl-journal.db`). README.md and rl-control-plane.md start their own gateway (`bash
  server` blocks): the test starts only the engines the latter names. A doc's blocks share its
  fleet, in document order, and shell variables carry from one block to the next as in one
  terminal.

Everything a doc starts (in the background, or as a `server` block) runs in its own process
group and is stopped by that group's id when the doc is done.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from docblocks import ROOT, SHELL, Block, all_blocks, commands, output_matches, shown_outputs, substitute

from smgrl.demo.procs import Child, free_port, start_fake_engines, start_gateway, wait_for_workers

pytestmark = pytest.mark.e2e

BLOCK_TIMEOUT_SECS = 60
READY_TIMEOUT_SECS = 30
PYTHON = Path(sys.executable)
# Variables bash sets by itself (besides those of a fresh bash, .vars-baseline): never carried.
_BASH_OWN = (
    "BASH*|COMP*|OPT*|PS*|EPOCH*|_|__smgrl*|PIPESTATUS|FUNCNAME|LINENO|SECONDS|RANDOM|SRANDOM|COLUMNS|LINES"
)


@attrs.define
class Doc:
    """One doc's run: its directory, substitutions and what was started for it."""

    work: Path
    env: dict[str, str] = attrs.field(factory=dict)
    subs: list[tuple[str, str]] = attrs.field(factory=list)
    children: list[Child] = attrs.field(factory=list)
    groups: list[int] = attrs.field(factory=list)  # process groups of blocks (pgid = our bash's pid)
    servers: list[subprocess.Popen] = attrs.field(factory=list)
    n: int = 0

    def next_name(self, suffix: str) -> Path:
        self.n += 1
        return self.work / f".block-{self.n}.{suffix}"


def _consecutive_free_ports(count: int) -> int:
    """A first port such that it and the next count-1 are free now (for `--ports A-B`)."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def _gateway_subs(port: int) -> list[tuple[str, str]]:
    return [
        ("127.0.0.1:30000", f"127.0.0.1:{port}"),
        ("localhost:30000", f"127.0.0.1:{port}"),
        ("--port 30000", f"--port {port}"),
    ]


def _default_fleet(doc: Doc, fake_args: tuple[str, ...] = ()) -> None:
    """Two fake SGLang engines and a gateway on ./smgrl-journal.db, workers listed."""
    child, urls = start_fake_engines("sglang", 2, fake_args)
    doc.children.append(child)
    port = free_port()
    log = open(doc.work / ".gateway.log", "a")  # noqa: SIM115 - held by the child for its lifetime
    args = ["--enable-rl", "--worker-urls", *urls, "--journal", str(doc.work / "smgrl-journal.db")]
    gateway = start_gateway([*args, "--prometheus-port", str(free_port())], port=port, log=log)
    doc.children.append(gateway)
    wait_for_workers(f"http://127.0.0.1:{port}", 2, child=gateway)
    doc.subs += _gateway_subs(port)


def _readme(doc: Doc) -> None:
    # The README starts its own engines (31000-31003) and gateway (30000).
    base = _consecutive_free_ports(4)
    doc.subs += _gateway_subs(free_port())
    doc.subs += [("--ports 31000-31003", f"--ports {base}-{base + 3}")]
    doc.subs += [(f"127.0.0.1:{31000 + i}", f"127.0.0.1:{base + i}") for i in range(4)]


def _control_plane(doc: Doc) -> None:
    # The guide's launch line names two engines and a deployment path: fakes and a temp file.
    child, urls = start_fake_engines("sglang", 2)
    doc.children.append(child)
    doc.subs += _gateway_subs(free_port())
    doc.subs += [("http://10.0.0.1:30000", urls[0]), ("http://10.0.0.2:30000", urls[1])]
    doc.subs += [("/var/lib/smgrl/journal.db", str(doc.work / "journal.db"))]


def _tokenspeed(doc: Doc) -> None:
    # The fake TokenSpeed control app the doc starts on 30400 stands in for 10.0.0.5:30400.
    _default_fleet(doc)
    port = free_port()
    doc.subs += [("--ports 30400", f"--ports {port}"), ("10.0.0.5:30400", f"127.0.0.1:{port}")]
    doc.subs += [("127.0.0.1:30400", f"127.0.0.1:{port}")]


def _scale_out(doc: Doc) -> None:
    # The --workers recipe starts its own engines (31000-31001) and supervisor (30000, 29000).
    base = _consecutive_free_ports(2)
    doc.subs += _gateway_subs(free_port())
    doc.subs += [("--ports 31000-31001", f"--ports {base}-{base + 1}")]
    doc.subs += [(f"127.0.0.1:{31000 + i}", f"127.0.0.1:{base + i}") for i in range(2)]
    metrics = free_port()
    doc.subs += [
        ("--prometheus-port 29000", f"--prometheus-port {metrics}"),
        ("127.0.0.1:29000", f"127.0.0.1:{metrics}"),
    ]
    # The pinned-ports recipe: its own supervisor (30100, 29100) and two pairs of worker ports.
    forward, wmetrics = _consecutive_free_ports(2), _consecutive_free_ports(2)
    doc.subs += [
        ("--port 30100", f"--port {free_port()}"),
        ("--prometheus-port 29100", f"--prometheus-port {free_port()}"),
        ("--forward-port 30110", f"--forward-port {forward}"),
        ("--worker-metrics-port 29110", f"--worker-metrics-port {wmetrics}"),
    ]


SETUPS: dict[str, Callable[[Doc], None]] = {
    "README.md": _readme,
    "docs/rl-control-plane.md": _control_plane,
    # Its PSRL example asks for version 118 or newer: a fleet at 120.
    "docs/data-plane.md": lambda doc: _default_fleet(doc, ("--weight-version", "120")),
    "docs/tokenspeed.md": _tokenspeed,
    "docs/scale-out.md": _scale_out,
}


def _runnable_docs() -> list[str]:
    return sorted({b.doc for b in all_blocks() if b.runs})


def _curl_shim(directory: Path) -> Path:
    real = shutil.which("curl")
    assert real, "the docs test needs curl on PATH"
    shim = directory / "curl"
    shim.write_text(
        "#!/bin/sh\n# docs test: an HTTP error fails the example (unless its output is checked)\n"
        f'if [ -n "${{DOCS_SHOWN_OUTPUT:-}}" ]; then exec {real} "$@"; fi\n'
        f'exec {real} --fail-with-body "$@"\n'
    )
    shim.chmod(0o755)
    return directory


@pytest.fixture
def doc_env(tmp_path) -> Iterator[Doc]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    shims = _curl_shim(tmp_path)
    doc = Doc(work)
    doc.subs += [("/tmp/ckpt/", f"{work}/ckpt/")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMGRL_")}
    env["PATH"] = f"{shims}:{PYTHON.parent}:{env.get('PATH', '')}"
    doc.env = env
    baseline = subprocess.run(
        ["bash", "-c", "compgen -v"], env=env, capture_output=True, text=True, check=True
    ).stdout
    (work / ".vars-baseline").write_text(baseline)
    (work / ".vars").write_text("")
    try:
        yield doc
    finally:
        _stop_groups(doc.groups, doc.servers)
        for child in reversed(doc.children):
            child.stop()


def _stop_groups(groups: list[int], servers: list[subprocess.Popen]) -> None:
    """SIGTERM every process group a block started (ours: each is led by a bash we spawned),
    then SIGKILL what is left after a bound."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 20
    for pgid in groups:
        while time.monotonic() < deadline:
            for server in servers:
                server.poll()  # reap: a zombie leader would keep its group "alive"
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _prepared(doc: Doc, text: str) -> str:
    text = substitute(text, doc.subs)
    while "smgrl launch" in text and "--prometheus-port" not in text:
        text = text.replace("smgrl launch", f"smgrl launch --prometheus-port {free_port()}", 1)
    return text


def _script(doc: Doc, body: str, save_vars: bool) -> str:
    """bash: strict mode, the variables of earlier blocks, the block, then its variables saved."""
    work = doc.work
    save = ""
    if save_vars:
        # Each block is a fresh bash: what it defines beyond a fresh bash's variables is saved
        # with `declare -p` and sourced by the next block, as one terminal would keep it.
        save = (
            "declare -A __smgrl_base=()\n"
            f"while read -r __smgrl_n; do __smgrl_base[$__smgrl_n]=1; done < {work}/.vars-baseline\n"
            "__smgrl_save() { local __smgrl_n; for __smgrl_n in $(compgen -v); do\n"
            '  [[ -n "${__smgrl_base[$__smgrl_n]:-}" ]] && continue\n'
            f'  case "$__smgrl_n" in {_BASH_OWN}) continue;; esac\n'
            '  declare -p "$__smgrl_n"\n'
            f"done > {work}/.vars.new && mv {work}/.vars.new {work}/.vars; }}\n"
            "trap __smgrl_save EXIT\n"
        )
    return f"set -euo pipefail\nsource {work}/.vars\n{save}{body}"


def _run_shell(doc: Doc, body: str, *, shown_output: bool = False) -> tuple[int | str, str, Path]:
    """Run one shell text in its own process group; output to a file (a background process may
    keep the pipe of a captured run open forever). Returns the exit status (or why there is
    none), the output and the output file."""
    out = doc.next_name("out")
    env = dict(doc.env)
    if shown_output:
        env["DOCS_SHOWN_OUTPUT"] = "1"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", "-c", _script(doc, body, save_vars=True)],
            cwd=doc.work,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        doc.groups.append(proc.pid)
        try:
            code: int | str = proc.wait(BLOCK_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            code = f"none: still running after {BLOCK_TIMEOUT_SECS} s"  # its group is stopped at teardown
    return code, out.read_text(), out


def _start_server(doc: Doc, body: str) -> tuple[subprocess.Popen, Path]:
    out = doc.next_name("log")
    sink = out.open("w")
    proc = subprocess.Popen(
        ["bash", "-c", _script(doc, body, save_vars=False)],
        cwd=doc.work,
        env=doc.env,
        stdout=sink,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    sink.close()
    doc.groups.append(proc.pid)
    doc.servers.append(proc)
    return proc, out


def _ports_started(text: str) -> list[int]:
    """The ports a shell text starts listeners on: `--port N`, `--ports A-B` / `A,B` (not 0)."""
    ports = [int(p) for p in re.findall(r"--port\s+(\d+)", text)]
    for spec in re.findall(r"--ports\s+([\d,-]+)", text):
        for part in spec.split(","):
            first, _, last = part.partition("-")
            ports += range(int(first), int(last or first) + 1)
    return [p for p in ports if p]


def _worker_count(text: str) -> int:
    match = re.search(r"--worker-urls((?:\s+\\?\s*(?:https?|grpcs?|ipc)://\S+)+)", text)
    return len(re.findall(r"://", match.group(1))) if match else 0


def _wait_ready(text: str, alive: Callable[[], bool], log: Path) -> None:
    """Wait until what a block started listens (and a gateway lists its --worker-urls)."""
    deadline = time.monotonic() + READY_TIMEOUT_SECS
    for port in _ports_started(text):
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if not alive() or time.monotonic() > deadline:
                    pytest.fail(f"nothing listens on {port} (started by the block):\n{log.read_text()}")
                time.sleep(0.05)
    count = _worker_count(text)
    gateway_port = (
        next(iter(_ports_started(text.split("smgrl launch", 1)[1])), None) if "smgrl launch" in text else None
    )
    if count and gateway_port and "--enable-rl" in text:
        try:
            wait_for_workers(
                f"http://127.0.0.1:{gateway_port}", count, timeout=max(1, deadline - time.monotonic())
            )
        except TimeoutError as exc:
            pytest.fail(f"{exc}:\n{log.read_text()}")


def _check_output(doc: Doc, where: str, expected: str, out: str) -> None:
    """The output a doc shows vs what was printed, the test's addresses mapped back to the doc's."""
    actual = substitute(out, [(new, old) for old, new in doc.subs])
    assert output_matches(expected, actual), (
        f"{where}\n--- the doc shows:\n{expected}\n--- printed (addresses mapped back):\n{actual}"
    )


def _run_block(doc: Doc, block: Block, shown: Block | None) -> None:
    """Run one block; ``shown``: the ```text output block after it, if any."""
    if block.lang == "console":
        # The commands get the test's addresses; the output shown keeps the doc's (the printed
        # output is mapped back before the comparison).
        for command in commands(block.text):
            shown = bool(command.expected)
            code, out, _ = _run_shell(doc, _prepared(doc, command.command), shown_output=shown)
            where = f"{block.where}: $ {command.command}"
            assert code == 0, f"{where}\nexit status {code}\n--- output:\n{out}"
            _check_output(doc, where, command.expected, out)
        return
    text = _prepared(doc, block.text)
    if block.lang in SHELL and block.server:
        proc, log = _start_server(doc, text)
        _wait_ready(text, lambda: proc.poll() is None, log)
        return
    if block.lang in SHELL:
        code, out, log = _run_shell(doc, text)
        assert code == 0, f"{block.where}: exit status {code}\n--- block:\n{text}\n--- output:\n{out}"
        if any(line.rstrip().endswith("&") for line in text.splitlines()):
            _wait_ready(text, lambda: True, log)  # it started something in the background
        if shown is not None:
            _check_output(doc, shown.where, shown.text, out)
        return
    if block.lang == "python":
        script = doc.next_name("py")
        script.write_text(text)
        run = subprocess.run(
            [str(PYTHON), str(script)],
            check=False,
            cwd=doc.work,
            env=doc.env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_SECS,
            stdin=subprocess.DEVNULL,
        )
        assert run.returncode == 0, (
            f"{block.where}: exit status {run.returncode}\n--- block:\n{text}\n{run.stdout}{run.stderr}"
        )
        if shown is not None:
            _check_output(doc, shown.where, shown.text, run.stdout)
        return
    raise AssertionError(f"{block.where}: no way to run a {block.lang} block")


@pytest.mark.parametrize("doc_name", _runnable_docs())
def test_doc_examples_run(doc_name, doc_env):
    blocks = [b for b in all_blocks() if b.doc == doc_name]
    shown = shown_outputs(blocks)
    SETUPS.get(doc_name, _default_fleet)(doc_env)
    for block in blocks:
        if block.runs:
            _run_block(doc_env, block, shown.get(block))
