"""``smgrl journal``: read (and check, snapshot, compact) the gateway's journal file.

Importing this package registers every subcommand on :data:`journal_group`; ``smgrl.cli`` adds
the group to the ``smgrl`` command.
"""

from smgrl.journal_cli import admin, events, fleet, loopbacks, ops, refits, sessions  # noqa: F401 - they register commands
from smgrl.journal_cli.group import journal_group

__all__ = ["journal_group"]
