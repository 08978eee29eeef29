"""The ``smgrl`` program: ``smgrl journal ...`` runs the journal reader with only its own imports;
every other command goes through ``smgrl.cli``.

Reading the journal is what an operator does after something went wrong, often many times in a
row: the gateway's imports (trio, the fake engines, the demo, the server configuration) would
cost each ``smgrl journal`` command about 0.1 s of CPU more before it reads a row.
"""

from __future__ import annotations

import sys

import click

from smgrl.errors import ConfigError


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["journal"]:
        from smgrl.journal_cli import journal_group

        run(journal_group, args[1:], "smgrl journal")
        return
    from smgrl.cli import main as cli_main

    cli_main(args)


def run(command: click.Command, args: list[str], prog_name: str) -> None:
    """Run a click command: every bad flag value or configuration error is one line on stderr,
    exit 1."""
    try:
        # With standalone_mode=False, click RETURNS the code a command exits with (ctx.exit(n))
        # instead of raising: pass it on, or `smgrl journal verify` on a bad journal exits 0.
        code = command.main(args=args, prog_name=prog_name, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except ConfigError as exc:
        text = str(exc)
        click.echo(text if text.startswith("Configuration error") else f"error: {text}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
