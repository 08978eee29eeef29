"""The ``smgrl journal`` click group: options shared by every subcommand, opening the file, errors.

A ``postgresql://`` URL works wherever a path does: the subcommands read an SQLite copy of it,
kept up to date between commands in a cache directory (``pgmirror.py`` says why and how;
``verify`` reads a fresh copy), and write to PostgreSQL itself; the URL is shown without its
password. Every subcommand reads the SQLite file directly through a read-only store (safe while the
gateway appends: WAL readers never block the writer), except ``replay --snapshot`` and
``compact``, which open it read-write after checking it is a journal (a read-write open of any
other SQLite file would migrate it). Nothing here ever reads the ``secrets`` table.

Errors are one line on stderr, never a traceback, with an exit status that says what went wrong:
1 the journal failed a check or an id was not found, 2 a bad value or range on the command line,
3 no journal at the path, 4 the file is not a journal (or unreadable).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import click

from journal import JournalCorrupt, JournalError, SqliteStore, describe, is_postgres_url
from smgrl.cli.journal.render import SafeOutput, json_text, output, terminal_width
from smgrl.core.config import DEFAULT_JOURNAL
from smgrl.history.errors import EXIT_BAD_VALUE, EXIT_CHECK, EXIT_MISSING, EXIT_NOT_JOURNAL, QueryError
from smgrl.history.values import BadValue

__all__ = [
    "EXIT_BAD_VALUE",
    "EXIT_CHECK",
    "EXIT_MISSING",
    "EXIT_NOT_JOURNAL",
    "CliError",
    "Ctx",
    "command",
    "journal_group",
    "last_or_all",
    "refuse_last_with_all",
]

# The exit statuses and the error every subcommand raises are the history queries' own (the queries
# raise them too): one class, so that a failed query and a failed command report alike.
CliError = QueryError


def last_or_all(last_help: str, all_help: str) -> Callable:
    """``--last N`` and ``--all`` of a listing command (ops, refits, loopbacks), in that order."""

    def decorate(command: Callable) -> Callable:
        command = click.option("--all", "everything", is_flag=True, help=all_help)(command)
        return click.option("--last", type=click.IntRange(min=1), default=None, metavar="N", help=last_help)(
            command
        )

    return decorate


def refuse_last_with_all(last: int | None, everything: bool) -> None:
    if last is not None and everything:
        raise CliError("--last and --all contradict each other", EXIT_BAD_VALUE)


@attrs.define
class Ctx:
    """What the group's options give every subcommand (``click.pass_obj``)."""

    path: str
    json: bool
    wide: bool = False
    width: int | None = None
    now: float = attrs.field(factory=time.time)
    url: str | None = None  # a postgresql:// journal: ``path`` is then its SQLite copy
    _copy: contextlib.ExitStack = attrs.field(factory=contextlib.ExitStack)

    @property
    def label(self) -> str:
        """The journal as shown to the user (a URL without its password)."""
        return describe(self.url) if self.url else self.path

    fresh: bool = False  # a postgresql:// journal: read a fresh copy, not the cache (verify)

    def use(self, target: str) -> None:
        """Read ``target``: a path, or a postgresql:// URL read through its SQLite copy."""
        self._copy.close()
        self.url = None
        if not is_postgres_url(target):
            self.path = target
            return
        self.url = target
        self.path = self._copy.enter_context(_pg_copy(target, fresh=self.fresh))
        click.get_current_context().call_on_close(self._copy.close)

    @contextlib.contextmanager
    def reader(self) -> Iterator[SqliteStore]:
        store = open_readonly(self.path)
        try:
            yield store
        finally:
            store.close()

    @contextlib.contextmanager
    def writer(self) -> Iterator[SqliteStore]:
        if self.url is not None:
            with self.reader() as copy, _pg_writer(self.url) as store:
                yield _PgWrites(copy, store)  # type: ignore[misc]
            self.use(self.url)  # the copy follows what was written
            return
        open_readonly(self.path).close()  # proves it is a journal before a read-write open
        try:
            store = SqliteStore.open(self.path, busy_timeout_ms=30_000)
        except (JournalError, sqlite3.Error, OSError) as exc:
            raise CliError(f"cannot open {self.path} for writing: {exc}", EXIT_NOT_JOURNAL) from None
        try:
            yield store
        finally:
            store.close()

    def emit(self, obj: object, *, lines: bool = False) -> None:
        click.echo(json_text(obj, lines=lines))


# Commands that must read what PostgreSQL holds now, every row, not the cache (pgmirror.py).
_FRESH_COPY = frozenset({"verify"})


@contextlib.contextmanager
def _pg_copy(url: str, *, fresh: bool) -> Iterator[str]:
    from smgrl.cli.journal import pgmirror

    try:
        directory = None if fresh else pgmirror.cache_dir()
        copy = pgmirror.temporary_copy(url) if directory is None else pgmirror.cached_copy(url, directory)
        path = copy.__enter__()
    except ImportError:
        raise CliError(
            "a postgresql:// journal needs psycopg: pip install 'psycopg[binary]'", EXIT_NOT_JOURNAL
        ) from None
    except JournalError as exc:  # unreachable, not a journal: the message has no password
        raise CliError(str(exc), EXIT_NOT_JOURNAL) from None
    try:
        yield path
    finally:
        copy.__exit__(None, None, None)


class _PgWrites:
    """A PostgreSQL journal for a writing command: it reads the copy (consistent with what the
    command read so far, and what ``path`` names) and writes to PostgreSQL itself."""

    def __init__(self, copy: SqliteStore, store: Any) -> None:
        self._copy = copy
        self._store = store

    def save_snapshot(self, *args: Any, **kwargs: Any) -> list[int]:
        return self._store.save_snapshot(*args, **kwargs)

    def compact_bodies(self, before_seq: int) -> int:
        return self._store.compact_bodies(before_seq)

    def meta(self) -> dict[str, str]:
        return self._store.meta()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._copy, name)


@contextlib.contextmanager
def _pg_writer(url: str):
    from journal.postgres import PgStore

    try:
        store = PgStore.open(url)
    except JournalError as exc:
        raise CliError(f"cannot open {describe(url)} for writing: {exc}", EXIT_NOT_JOURNAL) from None
    try:
        yield store
    finally:
        store.close()


def open_readonly(path: str) -> SqliteStore:
    if not os.path.exists(path):
        raise CliError(f"no journal at {path} (use --journal PATH or set SMGRL_JOURNAL)", EXIT_MISSING)
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory, not a journal file", EXIT_NOT_JOURNAL)
    try:
        return SqliteStore.open(path, readonly=True)
    except JournalError as exc:
        raise CliError(str(exc), EXIT_NOT_JOURNAL) from None
    except sqlite3.Error as exc:
        raise CliError(f"{path} is not an smgrl journal ({exc})", EXIT_NOT_JOURNAL) from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_NOT_JOURNAL) from None


class JournalGroup(click.Group):
    """Turns the errors a subcommand raises into one line on stderr and an exit status."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        # Everything a subcommand prints goes through SafeOutput (control characters escaped),
        # its tables through the width and id settings of this invocation (render.py).
        as_json = lambda: bool(ctx.obj is not None and ctx.obj.json)
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = SafeOutput(out, as_json), SafeOutput(err, as_json)
        try:
            return self._invoke(ctx)
        finally:
            sys.stdout, sys.stderr = out, err

    def _invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CliError as exc:
            _fail(ctx, str(exc), exc.code)
        except BadValue as exc:
            _fail(ctx, str(exc), EXIT_BAD_VALUE)
        except JournalCorrupt as exc:  # a row edited outside the journal: it failed a check
            _fail(ctx, str(exc), EXIT_CHECK)
        except JournalError as exc:
            _fail(ctx, str(exc), EXIT_NOT_JOURNAL)
        except sqlite3.Error as exc:
            _fail(ctx, f"cannot read the journal: {exc}", EXIT_NOT_JOURNAL)
        except BrokenPipeError:
            # `smgrl journal events | head`: the reader left. Point stdout at /dev/null so the
            # interpreter's final flush does not raise again, and end quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(0)


def _fail(ctx: click.Context, message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)


@click.group(
    "journal",
    cls=JournalGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
)
# click declarations like every command's (events.py): each option is its own, nothing to share.
@click.option(
    "--journal",
    "path",
    default=DEFAULT_JOURNAL,
    show_default=True,
    envvar="SMGRL_JOURNAL",
    help="The journal file, or a postgresql:// URL (env SMGRL_JOURNAL).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (JSON; JSON Lines for events)."
)
@click.option("--wide", is_flag=True, help="Tables in full: whole ids, no cut cells, any width.")
# Option declarations shaped like the commands' (each its own flag and help).
@click.option(
    "--width",
    type=click.IntRange(min=60),
    default=None,
    metavar="N",
    help="Fit tables to N columns (default: the terminal's width, COLUMNS, else 120).",
)
@click.pass_context
def journal_group(ctx: click.Context, path: str, as_json: bool, wide: bool, width: int | None) -> None:
    """Read the gateway's journal file: events, workers, operations, refits, versions, checks."""
    if ctx.invoked_subcommand is None:
        # `smgrl journal` alone: what there is to run, not a usage error.
        click.echo(ctx.get_help())
        ctx.exit(0)
    ctx.obj = Ctx(
        path=path, json=as_json, wide=wide, width=width, fresh=ctx.invoked_subcommand in _FRESH_COPY
    )
    if is_postgres_url(path):
        ctx.obj.use(path)


def command(
    name: str, *, group: click.Group | None = None, **kwargs: Any
) -> Callable[[Callable], click.Command]:
    """Register a subcommand taking ``(ctx: Ctx, **options)``; it also accepts ``--journal`` and
    ``--json`` after its name (``smgrl journal events --json``), overriding the group's."""

    def deco(fn: Callable) -> click.Command:
        @functools.wraps(fn)
        def wrapper(
            *args: Any,
            sub_path: str | None,
            sub_json: bool,
            sub_wide: bool,
            sub_width: int | None,
            **opts: Any,
        ) -> Any:
            ctx = click.get_current_context().find_object(Ctx)
            assert ctx is not None
            if sub_path:
                ctx.use(sub_path)
            if sub_json:
                ctx.json = True
            ctx.wide = ctx.wide or sub_wide
            ctx.width = sub_width if sub_width is not None else ctx.width
            with output(terminal_width(ctx.width), ctx.wide):
                return fn(ctx, *args, **opts)

        wrapper = click.option(
            "--width",
            "sub_width",
            type=click.IntRange(min=60),
            default=None,
            metavar="N",
            help="Fit tables to N columns.",
        )(wrapper)
        wrapper = click.option("--wide", "sub_wide", is_flag=True, help="Tables in full (whole ids).")(
            wrapper
        )
        wrapper = click.option("--json", "sub_json", is_flag=True, help="Machine-readable output.")(wrapper)
        wrapper = click.option(
            "--journal",
            "sub_path",
            default=None,
            metavar="PATH",
            help="The journal file (overrides the group's).",
        )(wrapper)
        return (group or journal_group).command(name, **kwargs)(wrapper)  # type: ignore[no-any-return]

    return deco
