"""What a journal query reports when it cannot answer, and the exit status each failure maps to.

The history queries are shared by the gateway's journal routes and ``smgrl journal``; the CLI prints
a :class:`QueryError` as ``error: <message>`` and exits with its ``code`` (docs/cli.md).
"""

from __future__ import annotations

__all__ = ["EXIT_BAD_VALUE", "EXIT_CHECK", "EXIT_MISSING", "EXIT_NOT_JOURNAL", "QueryError"]

EXIT_CHECK, EXIT_BAD_VALUE, EXIT_MISSING, EXIT_NOT_JOURNAL = 1, 2, 3, 4


class QueryError(Exception):
    """A failure to report as ``error: <message>`` with exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_CHECK) -> None:
        super().__init__(message)
        self.code = code
