"""Launch flags: SMG's validation texts and argparse-style multi-value flags."""

import pytest

from smgrl.cli.launch import expand_multi_value
from smgrl.core.auth import ControlPlaneKey, TenantKey
from smgrl.core.config import Config, RlConfig
from smgrl.core.errors import ConfigError
from smgrl.runtime.startup import validate


@pytest.mark.parametrize(
    "timeout, conc, message",
    [
        (
            0,
            32,
            (
                "Configuration error: Invalid value for field 'rl': control_timeout_secs=0 fanout_concurrency=32 - "
                "rl.control_timeout_secs must be >= 1"
            ),
        ),
        (
            600,
            0,
            (
                "Configuration error: Invalid value for field 'rl': control_timeout_secs=600 fanout_concurrency=0 - "
                "rl.fanout_concurrency must be >= 1"
            ),
        ),
        (
            0,
            0,
            (
                "Configuration error: Invalid value for field 'rl': control_timeout_secs=0 fanout_concurrency=0 - "
                "rl.control_timeout_secs must be >= 1"
            ),
        ),
    ],
)
def test_rl_zero_values_refused_only_when_enabled(timeout, conc, message):
    with pytest.raises(ConfigError) as exc:
        validate(Config(rl=RlConfig(enabled=True, control_timeout_secs=timeout, fanout_concurrency=conc)))
    assert str(exc.value) == message
    validate(Config(rl=RlConfig(enabled=False, control_timeout_secs=timeout, fanout_concurrency=conc)))


def test_defaults_are_smgs():
    cfg = validate(Config())
    assert (cfg.rl.control_timeout_secs, cfg.rl.fanout_concurrency, cfg.max_payload_size) == (
        600,
        32,
        536870912,
    )
    assert cfg.prometheus_port == 29000 and cfg.audit is True and not cfg.rl.enabled


@pytest.mark.parametrize("text", ["a:b:admin", "a:b:root:k", "::admin:k", "a:b:admin:"])
def test_bad_control_plane_keys(text):
    with pytest.raises(ConfigError):
        ControlPlaneKey.parse(text)


def test_key_parsing_allows_colons_in_the_key_and_hides_it():
    k = ControlPlaneKey.parse("id1:Trainer:ADMIN:se:cr:et")
    assert (k.id, k.name, k.role, k.key) == ("id1", "Trainer", "admin", "se:cr:et")
    assert "se:cr:et" not in repr(k)
    t = TenantKey.parse("t:abc")
    assert t.tenant == "t" and "abc" not in repr(t)


def test_scrubbed_config_has_no_secret():
    cfg = Config(
        api_key="wk-secret",
        control_plane_keys=(ControlPlaneKey("i", "n", "admin", "adm-secret"),),
        tenant_keys=(TenantKey("t", "tn-secret"),),
    )
    text = repr(cfg.scrubbed()) + repr(cfg)
    assert "wk-secret" not in text and "adm-secret" not in text and "tn-secret" not in text


@pytest.mark.parametrize(
    "argv, expanded",
    [
        (
            ["--worker-urls", "a", "b", "--port", "1"],
            ["--worker-urls", "a", "--worker-urls", "b", "--port", "1"],
        ),
        (["--worker-urls=a", "--enable-rl"], ["--worker-urls", "a", "--enable-rl"]),
        (["--worker-urls"], []),
        (
            ["--control-plane-api-keys", "x", "y"],
            ["--control-plane-api-keys", "x", "--control-plane-api-keys", "y"],
        ),
        (["--port", "1"], ["--port", "1"]),
    ],
)
def test_expand_multi_value(argv, expanded):
    assert expand_multi_value(argv) == expanded
