"""`--help` as people read it: every option of every command (subcommands included) has a help
text, no help line is wider than 80 columns on a narrow or a wide terminal, and `smgrl launch`
lists its flags under groups, every flag in one (smgrl/cli/help.py: a new flag needs a group)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from smgrl.cli.help import GROUP_ORDER, LAUNCH_GROUPS, WIDTH
from smgrl.cli.main import cli


def _commands(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(cli))
IDS = [" ".join(("smgrl", *path)) for path, _ in COMMANDS]


def _help(path: tuple[str, ...], columns: int) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_walked():
    assert {"launch", "demo", "refit", "fake-engine", "journal"} <= {p[0] for p, _ in COMMANDS if p}
    assert any(p[:1] == ("journal",) and len(p) == 2 for p, _ in COMMANDS)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_every_option_and_command_has_help(path, command):
    missing = [
        p.opts[0] for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help
    ]
    assert missing == [], f"smgrl {' '.join(path)}: options without help: {missing}"
    assert command.help or command.short_help, f"smgrl {' '.join(path)} has no description"


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_fits_80_columns(path, command, columns):
    wide = [line for line in _help(path, columns).splitlines() if len(line) > WIDTH]
    assert wide == [], f"smgrl {' '.join(path)} --help at COLUMNS={columns}:\n" + "\n".join(wide)


def test_every_launch_flag_has_a_group_and_every_group_entry_a_flag():
    launch = cli.commands["launch"]
    flags = {p.opts[0] for p in launch.params if isinstance(p, click.Option) and p.opts[0] != "-h"}
    ungrouped = sorted(f for f in flags if f not in LAUNCH_GROUPS)
    assert ungrouped == [], f"add these flags to LAUNCH_GROUPS in smgrl/cli/help.py: {ungrouped}"
    all_opts = {o for p in launch.params for o in p.opts}
    assert sorted(set(LAUNCH_GROUPS) - all_opts) == []  # no entry for a flag that is gone
    assert set(LAUNCH_GROUPS.values()) <= set(GROUP_ORDER)


def test_launch_help_lists_the_groups_in_order():
    text = _help(("launch",), 80)
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    expected = [g for g in GROUP_ORDER if g in set(LAUNCH_GROUPS.values())] + ["Other options"]
    assert headings == expected
    # --help is the only option left for "Other options".
    other = text[text.index("Other options:") :].splitlines()[1:]
    assert [line.split()[0] for line in other if line.startswith("  -")] == ["-h,"]
