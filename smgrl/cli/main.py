"""``smgrl``: one click group. ``launch`` runs the gateway (``smgrl.cli.launch``); ``demo``,
``fake-engine``, ``journal`` and ``refit`` are the other commands, each from its own module.

Bad values exit 1 with one line on stderr: no traceback.
"""

from __future__ import annotations

import sys

import click

from smgrl import __version__
from smgrl.cli.help import CONTEXT
from smgrl.cli.launch import launch
from smgrl.cli.running import run


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="smgrl")
def cli() -> None:
    """smgrl: an RL control plane for fleets of inference engines, with an event journal."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: every bad flag value or configuration error is one line on stderr, exit 1."""
    run(cli, sys.argv[1:] if argv is None else argv, "smgrl")


def _register_subcommands() -> None:
    cli.add_command(launch, "launch")
    try:
        from smgrl.fake.cli import fake_engine
    except ImportError:  # pragma: no cover - the fakes ship with the package
        return
    cli.add_command(fake_engine, "fake-engine")
    from smgrl.demo.run import demo

    cli.add_command(demo, "demo")
    from smgrl.cli.journal import journal_group

    cli.add_command(journal_group, "journal")
    from smgrl.cli.refit import refit_command

    cli.add_command(refit_command, "refit")


_register_subcommands()
