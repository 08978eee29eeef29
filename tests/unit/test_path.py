"""Engine path validation, query passthrough and the metric `op` label (docs/rl-control-plane.md,
"Calling one engine", "Metrics")."""

import pytest

from smgrl.core.path import EnginePathError, metric_op, passthrough_query, validate_engine_path

# -- crate: accepts_engine_route_shapes (+ SMG 1.13.0's observed shapes) ---------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("pause_generation", "pause_generation"),
        ("/pause_generation", "pause_generation"),
        ("update_weights_from_disk", "update_weights_from_disk"),
        ("inference/v1/generate", "inference/v1/generate"),
        ("v1/chat/completions/render", "v1/chat/completions/render"),
        ("server_info", "server_info"),
        ("wake_up", "wake_up"),
        ("a/b/c/d", "a/b/c/d"),
        ("a/b", "a/b"),  # what `a%2Fb` decodes to: two segments
        ("a/b/c", "a/b/c"),  # `a/b%2Fc`
        ("aAb", "aAb"),  # `a%41b`
        ("...", "..."),
        (".a", ".a"),
        ("a.", "a."),
        ("x" * 300, "x" * 300),
        ("A-Z_a-z.0-9", "A-Z_a-z.0-9"),
    ],
)
def test_accepts_engine_route_shapes(raw, want):
    assert validate_engine_path(raw) == want


# -- crate: rejects_bad_paths (all 11) with their exact reasons ------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "path is empty"),
        ("/", "path is empty"),
        ("//pause", "path has an empty segment"),
        ("../workers", "path must not contain `.` or `..` segments"),
        ("a/../b", "path must not contain `.` or `..` segments"),
        ("pause?mode=keep", "path must not contain `?` or `#`"),
        ("pause#frag", "path must not contain `?` or `#`"),
        ("a/b/c/d/e", "path has more than 4 segments"),
        ("pause generation", "segment `pause generation` contains characters outside [A-Za-z0-9._-]"),
        ("pause%20generation", "segment `pause%20generation` contains characters outside [A-Za-z0-9._-]"),
        ("pause/", "path has an empty segment"),
    ],
)
def test_rejects_bad_paths(raw, reason):
    with pytest.raises(EnginePathError) as info:
        validate_engine_path(raw)
    assert info.value.reason == reason
    assert str(info.value) == f"invalid engine path: {reason}"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("..", "path must not contain `.` or `..` segments"),  # `%2e%2e` decoded
        (".", "path must not contain `.` or `..` segments"),
        ("a/./b", "path must not contain `.` or `..` segments"),
        ("a:b", "segment `a:b` contains characters outside [A-Za-z0-9._-]"),
        ("é", "segment `é` contains characters outside [A-Za-z0-9._-]"),  # `%C3%A9` decoded
        ("a~b", "segment `a~b` contains characters outside [A-Za-z0-9._-]"),
        ("a/b?", "path must not contain `?` or `#`"),  # `%3F` decoded
        ("a/b%23", "segment `b%23` contains characters outside [A-Za-z0-9._-]"),
        ("//", "path has an empty segment"),
        ("/a//b", "path has an empty segment"),
        # Checks run in order: `?`/`#` before the segment count, count before segments.
        ("a/b/c/d/e?x", "path must not contain `?` or `#`"),
        ("a/b/c/d/", "path has more than 4 segments"),
        ("../a b", "path must not contain `.` or `..` segments"),
        ("a b/..", "segment `a b` contains characters outside [A-Za-z0-9._-]"),
    ],
)
def test_more_rejections_and_check_order(raw, reason):
    with pytest.raises(EnginePathError) as info:
        validate_engine_path(raw)
    assert info.value.reason == reason


def test_only_one_leading_slash_is_stripped():
    with pytest.raises(EnginePathError, match="empty segment"):
        validate_engine_path("//x")


# -- crate: query_passthrough_drops_only_selector (+ SMG 1.13.0's observed queries) ----------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, None),
        ("", None),
        ("selector=engine%3Dsglang", None),
        ("mode=keep&selector=engine%3Dsglang&level=2", "mode=keep&level=2"),
        ("tags=weights&tags=kv_cache", "tags=weights&tags=kv_cache"),
        ("selectorx=1", "selectorx=1"),
        ("flag", "flag"),
        ("selector=a&selector=b", None),
        ("selector", None),  # a bare `selector` key is still `selector`
        ("selector=", None),
        ("Selector=x", "Selector=x"),  # case matters
        ("selector%3Dx=1", "selector%3Dx=1"),  # the raw key is compared, not a decoded one
        ("a&&b", "a&b"),  # empty pieces dropped
        ("&&", None),
        ("&selector=x&", None),
        ("q=a+b&r=%7E&s=%C3%A9", "q=a+b&r=%7E&s=%C3%A9"),  # never re-encoded
        ("a=1=2&selector=x=y", "a=1=2"),
        ("x=1&selector=s&x=2", "x=1&x=2"),
    ],
)
def test_query_passthrough_drops_only_selector(raw, want):
    assert passthrough_query(raw) == want


# -- metrics.rs: op_label_is_bounded ---------------------------------------------------------------

KNOWN = [
    "pause_generation",
    "continue_generation",
    "update_weights_from_disk",
    "update_weights_from_tensor",
    "update_weights_from_distributed",
    "init_weights_update_group",
    "destroy_weights_update_group",
    "update_weight_version",
    "flush_cache",
    "abort_request",
    "release_memory_occupation",
    "resume_memory_occupation",
    "pause",
    "resume",
    "sleep",
    "wake_up",
    "collective_rpc",
    "server_info",
    "get_server_info",
    "health",
]


@pytest.mark.parametrize("op", KNOWN)
def test_known_ops_are_their_own_label(op):
    assert metric_op(op) == op


@pytest.mark.parametrize(
    "path",
    ["inference/v1/generate", "v1/chat/completions/render", "../etc", "", "echo", "Pause", "health/x"],
)
def test_op_label_is_bounded(path):
    assert metric_op(path) == "other"
