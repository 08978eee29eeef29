"""Startup checks that need the process (the configuration as a whole, before anything listens), and
the one line a startup failure prints.

``smgrl.core.config.check`` is the pure part (flag values, SMG's wording); this adds what imports
user code (the ``--admission-hook`` module), so a bad hook is one line at startup, not a failure on
the first rollout.
"""

from __future__ import annotations

import trio

from journal import ProjectionError
from smgrl.core.config import Config, check
from smgrl.core.errors import ConfigError, StartupError
from smgrl.dataplane import HookError, resolve
from smgrl.routing import InvalidVersionPolicy, VersionPolicy

__all__ = ["failure_line", "validate"]


def validate(cfg: Config) -> Config:
    """``check`` the values and the version policy, then resolve the admission hook; ConfigError on
    the first problem."""
    check(cfg)
    try:
        VersionPolicy.parse(cfg.rl.version_policy)
    except InvalidVersionPolicy as exc:
        raise ConfigError(f"Invalid --rl-version-policy: {exc}") from None
    if cfg.dataplane.admission_hook is not None:
        try:
            resolve(cfg.dataplane.admission_hook)
        except HookError as exc:
            raise ConfigError(str(exc)) from None
    return cfg


def failure_line(exc: BaseException) -> str | None:
    """The one line to print for a failure that is not a bug, or None (let the traceback show).

    trio wraps what a task raises in (nested) exception groups, so the leaves are looked at:
    a fail-stop (``ProjectionError``, journal/writer.py: memory could not follow the journal)
    wherever it sits; a StartupError or ConfigError when nothing else but cancellations is there.
    """
    leaves = list(_leaves(exc))
    stopped = [e for e in leaves if isinstance(e, ProjectionError)]
    if stopped:
        return f"{stopped[0]}; the gateway stopped (restart it to replay the journal)"
    wanted = [e for e in leaves if isinstance(e, (StartupError, ConfigError))]
    others = [e for e in leaves if not isinstance(e, (StartupError, ConfigError, trio.Cancelled))]
    if not wanted or others:
        return None
    return str(wanted[0])


def _leaves(exc: BaseException):
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc
