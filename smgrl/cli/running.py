"""Running a click command the way every ``smgrl`` command runs: one error line, the exit status.

Shared by the entry (``smgrl journal`` fast path) and the main group; imports only click.
"""

from __future__ import annotations

import sys

import click

from smgrl.core.errors import ConfigError

__all__ = ["run"]


def run(command: click.Command, args: list[str], prog_name: str) -> None:
    """Run a click command. Every error is one line on stderr, ``error: ...``: a usage error (an
    unknown command or flag, a missing or malformed value) exits 2 and names the help to read; a
    configuration error (a value click accepted that the gateway cannot use) exits 1."""
    try:
        # With standalone_mode=False, click RETURNS the code a command exits with (ctx.exit(n))
        # instead of raising: pass it on, or `smgrl journal verify` on a bad journal exits 0.
        code = command.main(args=args, prog_name=prog_name, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except ConfigError as exc:
        click.echo(f"error: {config_text(str(exc))}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.UsageError as exc:
        path = exc.ctx.command_path if exc.ctx is not None else prog_name
        click.echo(f"error: {exc.format_message()} (see '{path} --help')", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


def config_text(text: str) -> str:
    """A configuration error's text without the ``Configuration error:`` prefix SMG's own
    messages carry (the ``error:`` the line starts with says it)."""
    return text.removeprefix("Configuration error: ")
