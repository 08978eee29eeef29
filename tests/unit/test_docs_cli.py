"""Docs are tested: every command and every flag of `smgrl launch`, `demo` and `fake-engine` is in
docs/cli.md (a new flag without a doc line fails here)."""

from pathlib import Path

import pytest

from smgrl.cli.main import cli

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_is_documented(name):
    assert f"smgrl {name}" in DOC


@pytest.mark.parametrize(
    "command, flag",
    [
        (name, opt)
        for name in ("launch", "demo", "fake-engine", "refit")
        for p in cli.commands[name].params
        for opt in p.opts
        if opt.startswith("--")
    ],
)
def test_every_flag_is_documented(command, flag):
    assert f"`{flag}" in DOC or f"{flag}`" in DOC, f"smgrl {command} {flag} is not in docs/cli.md"
