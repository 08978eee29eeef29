"""Incremental detokenization for streamed answers. Pure.

Each chunk of new token ids yields the text they add. Decoding only a window (from the last
point where the text was complete: the prefix offset) keeps the cost per chunk independent of
the answer's length; a window whose text ends in U+FFFD (a multi-byte character split across
tokens) is held until the next ids complete it. ``flush`` gives what is still held at the end,
so the pieces concatenated equal ``decode`` of every id (a property test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


class Detokenizer:
    __slots__ = ("_decode", "emitted", "ids", "prefix_offset", "read_offset")

    def __init__(self, decode, prompt_tail: Sequence[int] = ()) -> None:
        self._decode = decode  # ids -> text
        self.ids: list[int] = list(prompt_tail)
        # Decoding starts a few ids back (the prompt's tail) so that a tokenizer whose first
        # piece decodes differently at the start of a text (a leading space) does it right.
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.emitted = 0

    def add(self, new: Sequence[int]) -> str:
        if not new:
            return ""
        self.ids.extend(new)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith(REPLACEMENT):
            delta = text[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def whole(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` when nothing was added before (a buffered answer): what ``add``
        then ``flush`` give together, in one decode."""
        assert not self.ids, "whole() is for a detokenizer that holds nothing"
        self.ids.extend(ids)
        self.prefix_offset = self.read_offset = len(self.ids)
        return self._decode(self.ids)

    def flush(self) -> str:
        """The text of ids still held (an incomplete character at the end stays as U+FFFD)."""
        if self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text.removeprefix(prefix)
