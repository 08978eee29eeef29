"""Weight-version validation, ordering and observation (docs/data-plane.md, "Version policies"; SMG's version.rs)."""

import pytest

from smgrl.core.observe import CONTROL_STATES, VERSION_FIELDS
from smgrl.core.version import (
    MalformedVersion,
    Version,
    compare_versions,
    fleet_max,
    is_mixed,
    json_number_text,
    label_version,
    observation_problem,
    observed_version,
    parse_u64,
    validate_version,
    version_key,
)

EMPTY = "weight_version is empty"
TOO_LONG = "weight_version exceeds 128 bytes"
NOT_PRINTABLE = "weight_version contains a byte outside printable ASCII"


# -- validator ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("42", "42"),
        ("  step-7  ", "step-7"),
        ("!~", "!~"),
        ("x" * 128, "x" * 128),
        ("  " + "x" * 128 + "  ", "x" * 128),  # trimming first: padding cannot push it over
        ("e2e-refit", "e2e-refit"),
        ("\u3000v1\u00a0", "v1"),  # Rust trim strips Unicode White_Space
    ],
)
def test_the_validator_accepts_printable_ascii_within_the_cap(raw, want):
    assert validate_version(raw) == want


@pytest.mark.parametrize(
    ("raw", "message", "reason"),
    [
        ("", EMPTY, "empty"),
        ("   ", EMPTY, "empty"),
        ("\t\n", EMPTY, "empty"),
        ("x" * 129, TOO_LONG, "too_long"),
        ("é" * 65, TOO_LONG, "too_long"),  # 130 bytes: the cap is in bytes, checked before bytes
        ("a b", NOT_PRINTABLE, "not_printable_ascii"),
        ("v\x01", NOT_PRINTABLE, "not_printable_ascii"),
        ("v\x7f", NOT_PRINTABLE, "not_printable_ascii"),
        ("v\xe9", NOT_PRINTABLE, "not_printable_ascii"),
        ("v\n1", NOT_PRINTABLE, "not_printable_ascii"),
        ("\x1cv", NOT_PRINTABLE, "not_printable_ascii"),  # not whitespace to Rust: not trimmed
    ],
)
def test_the_validator_refuses_empty_over_cap_and_non_printable(raw, message, reason):
    with pytest.raises(MalformedVersion) as info:
        validate_version(raw)
    assert str(info.value) == message
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)


# -- ordering -------------------------------------------------------------------------------------


def test_numeric_versions_compare_by_value():
    assert compare_versions("10", "9") == 1
    assert compare_versions("042", "42") == 0
    assert version_key("042") == version_key("42")
    assert hash(version_key("042")) == hash(version_key("42"))
    assert Version.parse(" 7 ").raw == "7"
    assert Version.parse("7").numeric == 7


def test_text_versions_compare_lexically():
    assert compare_versions("step-9", "step-10") == 1
    assert Version.parse("abc").numeric is None
    assert version_key("abc") != version_key("acd")
    assert compare_versions("abc", "abc") == 0


def test_mixed_versions_fall_back_to_lexical_order():
    # '1' (0x31) sorts before 'd' (0x64).
    assert compare_versions("1", "default") == -1
    assert compare_versions("1", "1a") == -1
    assert is_mixed("1", "default")
    assert not is_mixed("1", "2")
    assert not is_mixed("a", "b")


def test_sorting_with_version_key():
    assert sorted(["10", "9", "100", "042"], key=version_key) == ["9", "10", "042", "100"]
    assert sorted(["step-10", "step-9", "step-1"], key=version_key) == ["step-1", "step-10", "step-9"]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0", 0),
        ("42", 42),
        ("042", 42),
        ("+7", 7),  # Rust's u64 parser accepts a leading `+`
        (str(2**64 - 1), 2**64 - 1),
        (str(2**64), None),  # overflow: text
        ("-1", None),
        ("+", None),
        ("", None),
        ("1_000", None),  # Python's int() would accept these; Rust does not
        ("٣", None),
        (" 1", None),
        ("1.0", None),
    ],
)
def test_parse_u64(text, want):
    assert parse_u64(text) == want


@pytest.mark.parametrize(
    ("versions", "want"),
    [
        (["9", "10", "step-99"], "10"),  # numeric versions win when any exist
        (["step-1", "step-2"], "step-2"),
        (["042", "41"], "042"),
        ([], None),
        ([None, "", "  "], None),
        (["1", None], "1"),
    ],
)
def test_fleet_max_prefers_numeric_versions(versions, want):
    assert fleet_max(versions) == want


@pytest.mark.parametrize(
    ("label", "want"),
    [(None, None), ("", None), ("default", None), (" default ", None), ("42", "42"), (" v3 ", "v3")],
)
def test_labels_seed_versions_except_the_placeholder(label, want):
    assert label_version(label) == want


# -- passthrough observation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("42", "42"),
        (" step-7 ", "step-7"),
        (42, "42"),
        (0, "0"),
        (-5, "-5"),
        (2**64 - 1, str(2**64 - 1)),
        (1.5, "1.5"),
        (100.0, "100.0"),  # serde_json prints f64 with a fraction
        (1e20, "1e20"),
        (1e16, "1e16"),
        (1e15, "1000000000000000.0"),
        (1e-7, "1e-7"),
        (0.00001, "0.00001"),
        (1.2345e-8, "1.2345e-8"),
        (-0.0, "-0.0"),
        (2**70, "1.1805916207174113e21"),  # beyond u64: a float to serde_json
    ],
)
def test_observed_version_accepts_strings_and_numbers(value, want):
    assert observed_version(value) == want
    assert observation_problem(value) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "not_a_string_or_number"),
        (True, "not_a_string_or_number"),
        (False, "not_a_string_or_number"),
        ([1], "not_a_string_or_number"),
        ({"v": 1}, "not_a_string_or_number"),
        (float("nan"), "not_a_string_or_number"),
        (float("inf"), "not_a_string_or_number"),
        (10**400, "not_a_string_or_number"),
        ("", "empty"),
        ("x" * 129, "too_long"),
        ("a b", "not_printable_ascii"),
    ],
)
def test_observed_version_refuses_other_json_and_invalid_versions(value, problem):
    assert observed_version(value) is None
    assert observation_problem(value) == problem


def test_json_number_text_is_none_for_non_numbers():
    assert json_number_text("1") is None
    assert json_number_text(True) is None


def test_observation_tables():
    assert VERSION_FIELDS == {
        "update_weights_from_disk": "weight_version",
        "update_weights_from_tensor": "weight_version",
        "update_weights_from_distributed": "weight_version",
        "update_weights_from_mooncake": "weight_version",
        "update_weight_version": "new_version",
        "finish_weight_update": "weight_version",
    }
    assert {k for k, v in CONTROL_STATES.items() if v == "paused"} == {"pause_generation", "pause"}
    assert {k for k, v in CONTROL_STATES.items() if v == "asleep"} == {"release_memory_occupation", "sleep"}
    assert {k for k, v in CONTROL_STATES.items() if v == "active"} == {
        "continue_generation",
        "resume",
        "resume_memory_occupation",
        "wake_up",
    }
