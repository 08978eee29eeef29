"""``smgrl.launch_router``: run smgrl where PSRL runs its SMG fork's gateway.

PSRL launches its gateways with ``smg.launch_router`` (PSRL 19c0474
psrl/workers/gen/rollout_gateway.py:17-33): it builds ``RouterArgs`` with
``RouterArgs.from_cli_args(namespace, use_router_prefix=False)`` and calls ``launch_router(args)``
in a daemon ``multiprocessing.Process``. Importing both names from here instead runs smgrl::

    from smgrl.launch_router import RouterArgs
    from smgrl.launch_router import launch_router

``launch_router`` blocks, serving the gateway (trio) in the calling process until SIGINT/SIGTERM.
A field smgrl cannot honour raises ``RouterArgsError`` naming it (one line) before anything
starts; what each field does is docs/psrl.md.
"""

from __future__ import annotations

import argparse
import os
import sys

# The gateway's modules load with this one: PSRL imports RouterArgs from here before it forks
# the gateway's process, so the child inherits them and serves well within PSRL's 3 s check
# instead of spending them importing (a second or more of CPU).
import smgrl.runtime.server  # noqa: F401 - loaded here, not in the child (above)
from smgrl.cli.gateway import run_gateway
from smgrl.cli.router_args import RouterArgs, RouterArgsError
from smgrl.cli.router_config import Launch, translate

__all__ = ["RouterArgs", "RouterArgsError", "launch_router", "plan"]


def plan(args: argparse.Namespace | RouterArgs, env: dict[str, str] | None = None) -> Launch:
    """What ``launch_router(args)`` would run (RouterArgsError when it would not start);
    ``env``: the environment to read (default: this process's)."""
    router_args = args if isinstance(args, RouterArgs) else RouterArgs.from_cli_args(args)
    return translate(router_args, env=env)


def launch_router(args: argparse.Namespace | RouterArgs) -> None:
    """Run the gateway ``args`` describe, in this process, until it is stopped."""
    launch = plan(args)
    tokenizer = launch.config.sessions.tokenizer_path
    if tokenizer:
        from smgrl.sessions import load_tokenizer

        load_tokenizer(tokenizer)  # a bad model directory: one line (ConfigError), before starting
    if launch.journal_dir is not None:
        os.makedirs(launch.journal_dir, mode=0o700, exist_ok=True)
    if launch.log_file is not None:
        _log_to(launch.log_file)
    for note in launch.notes:
        print(f"warning: {note}", file=sys.stderr, flush=True)
    run_gateway(launch.config)


def _log_to(path: str) -> None:
    """``log_dir``: the gateway's log lines (and a startup failure's one line) go to a file of
    its own in that directory, appended, instead of the parent's stderr."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
