"""The fenced code blocks of README.md and docs/*.md, and what the docs test does with each.

Every block names its language in the info string; runnable blocks are run unless marked:

| info string | what the docs test does |
|---|---|
| ```` ```bash ```` / ```` ```sh ```` | runs it with bash (`set -euo pipefail`), checks the exit status |
| ```` ```bash server ```` | starts long-running processes (`smgrl launch`, `smgrl fake-engine`): run in the background until the doc's last block ran, then stopped; the test waits until what it starts listens |
| ```` ```console ```` | `$ ` lines are commands (a trailing `\\` continues one), the lines after each are its expected output: `...` stands for anything, whitespace is ignored |
| ```` ```python ```` | runs it with the test's Python, checks the exit status |
| ```` ```json ```` / ```` ```text ```` | data or output, never run (diagrams, formats, sample answers) |
| ```` ```text output ```` right after a run `python` or `bash` block | what that block prints, checked as a console block's output is |
| ```` ```LANG no-run: REASON ```` | a runnable block that cannot run in the suite (installs, needs torch or a GPU, runs for minutes); the reason is required and the test lists it as skipped |

This module is pure (parsing, classification, output matching); ``test_docs_run.py`` runs them.
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
SHELL = {"bash", "sh"}
RUNNABLE = SHELL | {"console", "python"}
DATA = {"json", "text"}
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


@attrs.frozen
class Block:
    doc: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    options: str  # the info string after the language
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def no_run_reason(self) -> str | None:
        match = re.search(r"\bno-run\b:?(.*)$", self.options)
        return None if match is None else match.group(1).strip()

    @property
    def server(self) -> bool:
        return re.search(r"(^|\s)server(\s|$)", self.options) is not None

    @property
    def is_output(self) -> bool:
        """A ```text output block: what the block before it prints."""
        return self.lang == "text" and "output" in self.options.split()

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.no_run_reason is None


def doc_paths(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def parse(text: str, doc: str) -> list[Block]:
    """Every fenced block of a Markdown text (a fence closes with the same character, at least
    as long, as CommonMark says)."""
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, info = len(opening.group(1)), opening.group(2), opening.group(3).strip()
        if fence[0] == "`" and "`" in info:
            i += 1  # CommonMark: not a fence (a code span such as ```` ```bash ```` opening a line)
            continue
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing
                and closing.group(2)[0] == fence[0]
                and len(closing.group(2)) >= len(fence)
                and not closing.group(3).strip()
            ):
                break
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        lang, _, options = info.partition(" ")
        blocks.append(Block(doc, i + 1, lang, options.strip(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for p in doc_paths(root) for b in parse(p.read_text(), p.relative_to(root).as_posix())]


def shown_outputs(blocks: list[Block]) -> dict[Block, Block]:
    """{run python/bash block: the ```text output block right after it}."""
    pairs = {}
    for before, after in pairwise(blocks):
        if after.is_output and before.doc == after.doc and before.runs and before.lang in SHELL | {"python"}:
            pairs[before] = after
    return pairs


def problems(block: Block, shown: dict[Block, Block] | None = None) -> list[str]:
    """Why a block breaks the convention (empty when it follows it). ``shown``: the pairs of
    ``shown_outputs`` of the block's doc, to check that an output block has a block to check."""
    out = []
    if block.is_output and shown is not None and block not in shown.values():
        out.append("a ```text output block must come right after a run python or bash block")
    if not block.lang:
        out.append("no language in the info string (```bash, ```python, ```console, ```json, ```text ...)")
    elif block.lang not in RUNNABLE | DATA:
        out.append(f"unknown language {block.lang!r} (one of {sorted(RUNNABLE | DATA)})")
    reason = block.no_run_reason
    if reason is not None and not reason:
        out.append("`no-run` needs a reason: ```bash no-run: needs torch")
    if reason is not None and block.lang in DATA:
        out.append(f"`no-run` on a {block.lang} block, which is never run")
    if block.server and block.lang not in SHELL:
        out.append("`server` is for bash blocks")
    if block.lang == "console" and block.runs and not commands(block.text):
        out.append("a console block without a `$ ` command")
    return out


@attrs.frozen
class Command:
    command: str
    expected: str  # the output shown after it ("" when none is shown)


def commands(text: str) -> list[Command]:
    """A console block's commands and the output shown after each."""
    out: list[Command] = []
    lines = text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1  # text before the first prompt is commentary
            continue
        command = [lines[i][2:]]
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        out.append(Command("\n".join(command), "\n".join(expected).strip()))
    return out


def output_matches(expected: str, actual: str) -> bool:
    """Doctest-style: ``...`` matches anything (also nothing); all whitespace is ignored, so
    wrapped lines and JSON spacing in the doc do not matter, but every other character does."""
    if not expected.strip():
        return True
    squeeze = re.compile(r"\s+")
    pieces = [re.escape(squeeze.sub("", piece)) for piece in expected.split("...")]
    return re.fullmatch(".*?".join(pieces), squeeze.sub("", actual), re.DOTALL) is not None


def substitute(text: str, pairs: list[tuple[str, str]]) -> str:
    """Replace every doc value (address, path) by the test's, longest first, in one pass."""
    if not pairs:
        return text
    table = dict(pairs)
    pattern = re.compile("|".join(re.escape(k) for k in sorted(table, key=len, reverse=True)))
    return pattern.sub(lambda m: table[m.group(0)], text)
