"""The checked-in PSRL vLLM messages are what the regeneration script makes from the fork's file,
and they are a different wire from upstream vLLM's (the reason both exist)."""

import hashlib

from smg_grpc_proto.generated import vllm_engine_pb2 as upstream

from smgrl.upstream.grpc.protos import psrl_vllm_engine_pb2 as psrl
from smgrl.upstream.grpc.protos import regen


def test_checked_in_module_matches_the_generator():
    assert regen.main(["--check"]) == 0


def test_original_proto_is_the_recorded_file():
    assert hashlib.sha256(regen.ORIGINAL.read_bytes()).hexdigest() == regen.SOURCE_SHA256


def test_dp_rank_pin_is_lost_when_read_with_upstream_messages():
    wire = psrl.GenerateRequest(request_id="r", data_parallel_rank=3).SerializeToString()
    assert not upstream.GenerateRequest.FromString(wire).HasField("data_parallel_rank")
    assert psrl.GenerateRequest.FromString(wire).data_parallel_rank == 3
    # ... and an upstream pin read as PSRL's lands in kv_transfer_params_json's number.
    wire = upstream.GenerateRequest(request_id="r", data_parallel_rank=2).SerializeToString()
    assert psrl.GenerateRequest.FromString(wire).data_parallel_rank == 0
