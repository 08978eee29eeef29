"""docs/journal.md is tested: every event type (with every field) and every `smgrl journal`
subcommand (with every option) is documented; a new one without its doc line fails here."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import click
import pytest

from smgrl.cli.journal import journal_group
from smgrl.events import event_class
from smgrl.history.filters import catalogue

DOC = (Path(__file__).resolve().parents[2] / "docs" / "journal.md").read_text()


def sections() -> dict[str, str]:
    """``### `name` `` heading -> the text up to the next heading."""
    parts = re.split(r"^### `([^`]+)`\s*$", DOC, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts) - 1, 2)}


def commands(group: click.Group, prefix: str = "smgrl journal") -> list[tuple[str, click.Command]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix} {name}"
        out.append((full, cmd))
        if isinstance(cmd, click.Group):
            out += commands(cmd, full)
    return out


def test_the_catalogue_is_not_empty():
    assert len(catalogue()) >= 14 and len(commands(journal_group)) >= 11


def test_the_shared_options_are_documented():
    usage = DOC.split("## `smgrl journal`: CLI reference", 1)[1].split("### ", 1)[0]
    group_options = [o for p in journal_group.params for o in p.opts]
    for opt in ("--journal", "--json", "--wide", "--width"):
        assert f"`{opt}" in usage and opt in group_options


@pytest.mark.parametrize("type_name", catalogue())
def test_every_event_type_and_field_is_documented(type_name):
    section = sections().get(type_name)
    assert section is not None, f"docs/journal.md has no '### `{type_name}`' section"
    for field in attrs.fields(event_class(type_name)):
        assert f"`{field.name}`" in section, (
            f"{type_name}.{field.name} is not in its section of docs/journal.md"
        )


@pytest.mark.parametrize("name, cmd", commands(journal_group), ids=[n for n, _ in commands(journal_group)])
def test_every_subcommand_and_option_is_documented(name, cmd):
    section = sections().get(name)
    assert section is not None, f"docs/journal.md has no '### `{name}`' section"
    shared = {"--journal", "--json", "--wide", "--width", "--help", "-h"}
    for param in cmd.params:
        for opt in param.opts:
            if opt.startswith("--") and opt not in shared:
                assert f"`{opt}" in section, f"{name} {opt} is not in its section of docs/journal.md"


def test_the_shared_options_and_exit_statuses_are_documented():
    for text in ("--journal PATH", "SMGRL_JOURNAL", "--json", "Exit status", "SMGRL_SNAPSHOT_EVERY"):
        assert text in DOC
