"""The docs' code blocks follow the convention of docblocks.py (every block is run, or data, or
marked `no-run:` with a reason), the blocks not run are listed as skipped (`pytest -ra`), and the
parser and the output matcher the docs test relies on behave (tables of cases)."""

from __future__ import annotations

import pytest
from docblocks import Block, all_blocks, commands, output_matches, parse, problems, shown_outputs, substitute


def test_every_block_is_run_data_or_marked_with_a_reason():
    blocks = all_blocks()
    assert len(blocks) > 20  # README.md and docs/*.md were read
    shown = shown_outputs(blocks)
    bad = {b.where: problems(b, shown) for b in blocks if problems(b, shown)}
    assert bad == {}, "\n".join(f"{where}: {'; '.join(p)}" for where, p in bad.items())
    assert any(b.runs and b.lang == "python" for b in blocks)
    assert any(b.runs and b.lang == "console" for b in blocks)


_NOT_RUN = [b for b in all_blocks() if b.no_run_reason]


@pytest.mark.parametrize("block", _NOT_RUN, ids=[b.where for b in _NOT_RUN])
def test_not_run(block):
    """One skipped item per block the docs test does not run, with the doc's reason."""
    first = block.text.strip().splitlines()[0] if block.text.strip() else ""
    pytest.skip(f"{block.where} not run ({block.no_run_reason}): {first[:60]}")


FENCE = "```"


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        (f"a\n{FENCE}bash\necho hi\n{FENCE}\n", [("bash", "", "echo hi\n", 2)]),
        (f"{FENCE}bash no-run: needs torch\nx\n{FENCE}", [("bash", "no-run: needs torch", "x\n", 1)]),
        (f"{FENCE}\nplain\n{FENCE}\n", [("", "", "plain\n", 1)]),
        # a longer fence holds a shorter one
        (f"````text\n{FENCE}\ninner\n{FENCE}\n````\n", [("text", "", f"{FENCE}\ninner\n{FENCE}\n", 1)]),
        # an indented fence (in a list): the indentation is removed from the body
        (f"- x\n  {FENCE}json\n  {{}}\n  {FENCE}\n", [("json", "", "{}\n", 2)]),
        (f"{FENCE}bash server\nsmgrl launch\n{FENCE}\n", [("bash", "server", "smgrl launch\n", 1)]),
        # a code span opening a line is not a fence (its info string would hold a backtick)
        (f"```` {FENCE}bash ```` runs\n{FENCE}json\n{{}}\n{FENCE}\n", [("json", "", "{}\n", 2)]),
    ],
)
def test_parse(markdown, expected):
    got = [(b.lang, b.options, b.text, b.line) for b in parse(markdown, "x.md")]
    assert got == expected


def _block(lang, options="", text="x\n"):
    return Block("x.md", 1, lang, options, text)


@pytest.mark.parametrize(
    ("block", "runs", "complaint"),
    [
        (_block("bash"), True, None),
        (_block("python"), True, None),
        (_block("console", text="$ echo hi\nhi\n"), True, None),
        (_block("json"), False, None),
        (_block("text"), False, None),
        (_block("bash", "no-run: needs torch"), False, None),
        (_block("bash", "server"), True, None),
        (_block(""), False, "no language"),
        (_block("shell"), False, "unknown language"),
        (_block("bash", "no-run"), False, "needs a reason"),
        (_block("bash", "no-run:  "), False, "needs a reason"),
        (_block("json", "no-run: data"), False, "never run"),
        (_block("python", "server"), True, "for bash blocks"),
        (_block("console", text="echo hi\n"), True, "without a `$ ` command"),
    ],
)
def test_the_convention(block, runs, complaint):
    assert block.runs is runs
    found = problems(block)
    if complaint is None:
        assert found == []
    else:
        assert len(found) == 1 and complaint in found[0], found


def test_an_output_block_belongs_to_the_block_before_it():
    blocks = parse(f"{FENCE}python\nprint(1)\n{FENCE}\n{FENCE}text output\n1\n{FENCE}\n", "x.md")
    assert shown_outputs(blocks) == {blocks[0]: blocks[1]}
    assert problems(blocks[1], shown_outputs(blocks)) == []
    # after data, or after a block that is not run: nothing to check it against
    for first in ("json\n{}", "python no-run: needs torch\nimport torch"):
        blocks = parse(f"{FENCE}{first}\n{FENCE}\n{FENCE}text output\n1\n{FENCE}\n", "x.md")
        assert shown_outputs(blocks) == {}
        assert "must come right after" in problems(blocks[1], {})[0]


def test_console_commands_and_their_output():
    text = 'intro\n$ curl -s a \\\n    -d b\n{"x": 1}\n$ true\n$ echo 2\n2\n\n'
    assert [(c.command, c.expected) for c in commands(text)] == [
        ("curl -s a \\\n    -d b", '{"x": 1}'),
        ("true", ""),
        ("echo 2", "2"),
    ]


@pytest.mark.parametrize(
    ("expected", "actual", "matches"),
    [
        ('{"a": 1, "b": "x"}', '{"a":1,"b":"x"}', True),  # whitespace is ignored
        ('{"a": 1, ...}', '{"a":1,"b":2,"c":[3]}', True),
        ('{"a": 2, ...}', '{"a":1,"b":2}', False),  # every other character counts
        ("x-request-id: gnt-...\nx: 1", "x-request-id: gnt-abc\r\nx: 1\r\n", True),
        ("x-request-id: gnt-...\nx: 1", "x-request-id: req-abc\r\nx: 1\r\n", False),
        ("HTTP/1.1 200", "HTTP/1.1 200 \r\n", True),
        ("HTTP/1.1 200", "HTTP/1.1 200 \r\nextra", False),  # the whole output, not a prefix
        ("...", "anything", True),
        ("", "not checked", True),  # no output shown: only the exit status counts
        ("a...b...c", "a--b--c", True),
        ("a...b...c", "a--c--b", False),
    ],
)
def test_output_matches(expected, actual, matches):
    assert output_matches(expected, actual) is matches


def test_substitute_is_one_pass_longest_first():
    pairs = [("127.0.0.1:30000", "127.0.0.1:5"), ("10.0.0.1:30000", "127.0.0.1:6"), ("30000", "7")]
    assert substitute("10.0.0.1:30000 127.0.0.1:30000 30000", pairs) == "127.0.0.1:6 127.0.0.1:5 7"
    # a replacement is never replaced again
    assert substitute("a", [("a", "b"), ("b", "c")]) == "b"
