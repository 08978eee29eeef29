"""Static capability rows and `rl.*` label overrides (docs/rl-control-plane.md, "Capabilities"; SMG's capability.rs)."""

import pytest

from smgrl.core.capability import Capabilities, capabilities_for

ALL_TRUE_LABELS = {
    "rl.pause_modes": "wait,abort,keep",
    "rl.update_from": "distributed,mooncake",
    "rl.abort": "true",
    "rl.flush_cache": "true",
    "rl.sleep_wake": "true",
    "rl.reports_weight_version": "true",
}


def test_sglang_and_vllm_static_rows():
    s = capabilities_for("sglang", {})
    assert s == Capabilities(
        "static", ("abort", "retract", "in_place"), ("disk", "tensor", "distributed"), True, True, True, True
    )
    v = capabilities_for("vllm", {})
    assert v == Capabilities(
        "static", ("abort", "wait", "keep"), ("disk", "distributed"), False, False, True, False
    )


def test_tokenspeed_static_row():
    t = capabilities_for("tokenspeed", {})
    assert t == Capabilities("static", ("wait", "abort"), ("distributed",), True, True, True, True)


@pytest.mark.parametrize("engine", ["trtllm", "mlx", "generic", "external", "unknown", "unspecified", ""])
def test_other_runtimes_have_no_capabilities(engine):
    assert capabilities_for(engine, {}) == Capabilities("static", (), (), False, False, False, False)


def test_labels_override_and_mark_source():
    c = capabilities_for(
        "trtllm",
        {
            "rl.pause_modes": "abort, keep",
            "rl.update_from": "disk",
            "rl.abort": "true",
            "rl.flush_cache": "TRUE",
            "rl.sleep_wake": "false",
            "rl.reports_weight_version": "yes",
        },
    )
    assert c == Capabilities("label", ("abort", "keep"), ("disk",), True, True, False, False)


def test_partial_override_keeps_static_rest():
    c = capabilities_for("sglang", {"rl.abort": "false"})
    assert c.source == "label"
    assert not c.abort
    assert c.flush_cache
    assert c.pause_modes == ("abort", "retract", "in_place")
    assert c.update_from == ("disk", "tensor", "distributed")


def test_engine_advertised_labels_override_the_tokenspeed_row():
    c = capabilities_for("tokenspeed", {**ALL_TRUE_LABELS, "rl.control_url": "http://0.0.0.0:30400"})
    assert c == Capabilities(
        "label", ("wait", "abort", "keep"), ("distributed", "mooncake"), True, True, True, True
    )


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (" abort , keep ,,", ("abort", "keep")),
        ("abort, in_place", ("abort", "in_place")),
        ("", ()),
        (" , ,", ()),
        ("abort", ("abort",)),
        ("abort,abort", ("abort", "abort")),  # kept as given: no de-duplication
        ("\u3000abort\u00a0", ("abort",)),  # Rust trim: Unicode White_Space
    ],
)
def test_list_labels_are_split_trimmed_and_empty_items_dropped(value, want):
    c = capabilities_for("sglang", {"rl.pause_modes": value})
    assert (c.source, c.pause_modes) == ("label", want)
    assert c.update_from == ("disk", "tensor", "distributed")


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("true", True),
        ("TRUE", True),
        ("True", True),
        ("  true\n", True),
        ("tRuE", True),
        ("yes", False),
        ("1", False),
        ("False", False),
        ("FALSE", False),
        ("", False),
        ("true,", False),
        ("t rue", False),
    ],
)
@pytest.mark.parametrize("key", ["rl.abort", "rl.flush_cache", "rl.sleep_wake", "rl.reports_weight_version"])
def test_boolean_labels_are_true_only_for_true(key, value, want):
    engine = "trtllm" if want else "sglang"  # so the override is visible either way
    c = capabilities_for(engine, {key: value})
    assert c.source == "label"
    assert c.to_json()[key.removeprefix("rl.")] is want


def test_unrelated_labels_keep_the_static_source():
    c = capabilities_for("sglang", {"rl.control_url": "http://x:1", "role": "policy", "rl.other": "true"})
    assert c.source == "static"


def test_to_json_field_order_and_lists():
    js = capabilities_for("vllm", {}).to_json()
    assert list(js) == [
        "source",
        "pause_modes",
        "update_from",
        "abort",
        "flush_cache",
        "sleep_wake",
        "reports_weight_version",
    ]
    assert js == {
        "source": "static",
        "pause_modes": ["abort", "wait", "keep"],
        "update_from": ["disk", "distributed"],
        "abort": False,
        "flush_cache": False,
        "sleep_wake": True,
        "reports_weight_version": False,
    }
