"""Registration labels from what engines report (SMG 1.13.0's observed rows, the gRPC rules of docs/tokenspeed.md)."""

import json

import pytest

from smgrl.core.discovery import grpc_labels, is_vllm, label_value, sglang_labels, vllm_labels

SERVER_INFO = {
    "model_path": "/m",
    "tokenizer_path": "/m",
    "served_model_name": "m",
    "tp_size": 2,
    "dp_size": 1,
    "pp_size": 1,
    "load_balance_method": "round_robin",
    "version": "0.5.23",
    "weight_version": "default",
    "is_embedding": False,
    "context_length": 4096,
    "enable_dp_attention": False,
    "max_running_requests": 128,
    "ep_size": 1,
    "page_size": 1,
    "dtype": "auto",
    "api_key": "SHOULD-NOT-LEAK",
    "role": "r",
    "max_model_len": 99,
    "internal_states": [{"weight_version": "live"}],
}
MODEL_INFO = {
    "has_image_understanding": False,
    "has_audio_understanding": False,
    "is_generation": True,
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "weight_version": "live",
}
MODELS = {"object": "list", "data": [{"id": "m", "owned_by": "sglang", "root": "/m", "max_model_len": 4096}]}


@pytest.mark.parametrize(
    "value, text",
    [
        (4096, "4096"),
        (True, "true"),
        (False, "false"),
        ("x", "x"),
        (["A"], '["A"]'),
        ({"a": 1}, '{"a":1}'),
        (None, None),
        (0.5, "0.5"),
    ],
)
def test_label_values_are_strings(value, text):
    assert label_value(value) == text


def test_sglang_labels_take_exactly_the_listed_fields():
    d = sglang_labels(SERVER_INFO, MODEL_INFO, MODELS)
    assert d.runtime == "sglang" and d.model_id == "m" and d.dp_size == 1
    assert d.labels == {
        "model_path": "/m",
        "tokenizer_path": "/m",
        "served_model_name": "m",
        "tp_size": "2",
        "dp_size": "1",
        "pp_size": "1",
        "load_balance_method": "round_robin",
        "version": "0.5.23",
        "weight_version": "default",
        "is_embedding": "false",
        "context_length": "4096",
        "enable_dp_attention": "false",
        "max_running_requests": "128",
        "has_image_understanding": "false",
        "has_audio_understanding": "false",
        "is_generation": "true",
        "architectures": '["Qwen3ForCausalLM"]',
        "model_type": "qwen3",
        "max_model_len": "4096",
    }
    assert "api_key" not in d.labels and "role" not in d.labels


def test_sglang_without_server_info_keeps_model_card_facts():
    d = sglang_labels(None, None, MODELS)
    assert d.runtime == "sglang"
    assert d.labels == {"max_model_len": "4096", "served_model_name": "m", "model_path": "/m"}
    assert "version" not in d.labels and d.dp_size is None


def test_vllm_is_detected_from_owned_by_and_keeps_few_labels():
    models = {"data": [{"id": "served", "owned_by": "vllm", "root": "/ckpt", "max_model_len": 2048}]}
    assert is_vllm(models) and not is_vllm(MODELS) and not is_vllm(None) and not is_vllm({"data": []})
    d = vllm_labels(models, {"version": "0.33.0"})
    assert d.runtime == "vllm"
    assert d.labels == {
        "max_model_len": "2048",
        "model_path": "/ckpt",
        "served_model_name": "served",
        "version": "0.33.0",
    }


def test_grpc_labels_rename_fill_only_and_keep_rl_advertisement():
    info = {
        "attn_tp_size": 4,
        "served_model_name": "ts",
        "active_requests": 3,
        "is_paused": False,
        "rl.control_url": "http://10.0.0.5:40100",
        "rl.pause_modes": "wait,abort,keep",
        "rl.update_from": "distributed",
        "tokenspeed_version": "0.1.1",
        "server_args": {"block_size": 16},
    }
    d = grpc_labels(info, "tokenspeed")
    assert d.labels["tp_size"] == "4" and d.labels["page_size"] == "16"
    assert (
        d.labels["rl.control_url"] == "http://10.0.0.5:40100"
        and d.labels["rl.pause_modes"] == "wait,abort,keep"
    )
    assert d.labels["version"] == "0.1.1"
    assert "active_requests" not in d.labels and "is_paused" not in d.labels
    assert grpc_labels({"tp_size": 2, "attn_tp_size": 8}, "tokenspeed").labels["tp_size"] == "2"
    assert "tp_size" not in grpc_labels({}, "tokenspeed").labels


@pytest.mark.parametrize("dp", ["²", "9" * 5000, "٣٣", " 2x"])
def test_a_dp_size_that_is_not_a_plain_number_is_not_a_size(dp):
    # "²".isdigit() is True and int() refuses it (and 4,300+ digits): discovery raised ValueError
    # out of the registration job on an engine reporting such a dp_size.
    assert sglang_labels({**SERVER_INFO, "dp_size": dp}, MODEL_INFO, MODELS).dp_size is None
    assert sglang_labels({**SERVER_INFO, "dp_size": 2, "attn_dp_size": dp}, MODEL_INFO, MODELS).dp_size == 2
    assert grpc_labels({**SERVER_INFO, "dp_size": dp}, "sglang").dp_size is None


async def test_a_vllm_engine_started_with_a_version_registers_without_one_as_in_smg():
    """SMG 1.13.0 (checked side by side against the same fake) shows ``weight_version: null`` for a
    vLLM row: its static table says vLLM reports no version, so registration never reads vLLM's
    dev-mode ``GET /weight_info``. smgrl matches it (docs/rl-control-plane.md); the row gets a
    version from the first confirmed refit or version write."""
    from smgrl.fake import fake_fleet
    from smgrl.registry.probe import _get, probe_http
    from smgrl.upstream import PoolSet

    pools = PoolSet(max_idle=2)
    async with fake_fleet("vllm", 1, weight_version="v7") as fleet:
        found = await probe_http(pools, fleet.urls[0], None, 5.0)
        status, engine_says = await _get(pools, fleet.urls[0], "/weight_info", None, 5.0)
    await pools.aclose()
    assert (status, json.loads(engine_says)) == (200, {"weight_version": "v7"})  # engines.md 2.4
    assert found.runtime == "vllm" and "weight_version" not in found.labels
