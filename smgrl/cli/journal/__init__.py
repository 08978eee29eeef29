"""``smgrl journal``: read (and check, snapshot, compact) the gateway's journal file.

Importing this package registers every subcommand on :data:`journal_group`; ``smgrl.cli.main`` adds
the group to the ``smgrl`` command.
"""

from smgrl.cli.journal import admin, events, fleet, loopbacks, ops, refits, sessions  # noqa: F401 - they register commands
from smgrl.cli.journal.group import journal_group
from smgrl.history.filters import catalogue, expand_types
from smgrl.history.reading import load_ops, read_events
from smgrl.history.values import BadValue, parse_time

__all__ = [
    "BadValue",
    "catalogue",
    "expand_types",
    "journal_group",
    "load_ops",
    "parse_time",
    "read_events",
]
