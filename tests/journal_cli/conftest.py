import pytest
from click.testing import CliRunner
from journal_cli_builder import fleet_journal

from smgrl.cli.journal import journal_group


@pytest.fixture
def journal(tmp_path):
    path = tmp_path / "fleet.db"
    ids = fleet_journal(path)
    ids["path"] = str(path)
    return ids


@pytest.fixture
def run(journal):
    """Run ``smgrl journal --journal <the test journal> ARGS``; returns the click Result."""

    def invoke(*args, path=None):
        runner = CliRunner()
        return runner.invoke(
            journal_group, ["--journal", path or journal["path"], *args], catch_exceptions=False
        )

    return invoke
