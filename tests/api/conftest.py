import pytest

from smgrl.core.config import Config, RlConfig


@pytest.fixture
def rl_config():
    return Config(rl=RlConfig(enabled=True, control_timeout_secs=5, fanout_concurrency=32), audit=True)
