"""The ``smgrl`` program: ``smgrl journal ...`` runs the journal reader with only its own imports;
every other command goes through ``smgrl.cli.main``.

Reading the journal is what an operator does after something went wrong, often many times in a
row: the gateway's imports (trio, the fake engines, the demo, the server configuration) would
cost each ``smgrl journal`` command about 0.1 s of CPU more before it reads a row.
"""

from __future__ import annotations

import sys

from smgrl.cli.running import run


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["journal"]:
        from smgrl.cli.journal import journal_group

        run(journal_group, args[1:], "smgrl journal")
        return
    from smgrl.cli.main import main as cli_main

    cli_main(args)
