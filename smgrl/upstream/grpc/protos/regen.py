"""Regenerate the messages of PSRL's vLLM wire (``psrl_vllm_engine_pb2.py``).

PSRL's SMG fork renumbers fields of the vLLM engine's messages (``GenerateRequest`` 8 is the
DP rank there, ``kv_transfer_params_json`` upstream; ``GenerateComplete`` 12 is a routed-experts
tensor) and drops ``GetLoads`` and ``FlushCache``. Its ``.proto`` is checked in byte for byte
(``psrl_vllm_engine.proto.orig``, provenance below, its sha256 verified here) and generated with
two mechanical changes so both vLLM variants live in one protobuf descriptor pool:

- the proto package ``vllm.grpc.engine`` becomes ``smgrl.psrl.vllm.grpc.engine`` and the file is
  named ``psrl_vllm_engine.proto`` (the upstream file registers the original names). Message
  names are not on the wire; the RPC paths stay ``/vllm.grpc.engine.VllmEngine/...`` because the
  client and the fakes name them as strings.
- ``import common_pb2`` is taken from ``smg_grpc_proto.generated`` (the shared messages:
  ``GetTokenizerChunk`` and the KV-event ones, identical in field numbers).

Run ``python -m smgrl.upstream.grpc.protos.regen`` (needs ``grpcio-tools``, in the test extra);
``--check`` exits 1 if the checked-in module differs from what it generates.
"""

from __future__ import annotations

import pathlib
import sys

from smgrl.upstream.grpc.protos.checked import CheckedProto

SOURCE_REPO = "github.com/Somoku/smg"
SOURCE_BRANCH = "psrl-dev"
SOURCE_COMMIT = "7169017bb38a3281825a639aa352b044ed69d3e5"
SOURCE_PATH = "crates/grpc_client/proto/vllm_engine.proto"
SOURCE_SHA256 = "ba1993b658b5480f41d397a4273705da64fd4eed5bf114f5e323c2ab94f3a839"

HERE = pathlib.Path(__file__).resolve().parent
ORIGINAL = HERE / "psrl_vllm_engine.proto.orig"
OUTPUT = HERE / "psrl_vllm_engine_pb2.py"
PACKAGE_FROM = "package vllm.grpc.engine;"
PACKAGE_TO = "package smgrl.psrl.vllm.grpc.engine;"
IMPORT_FROM = "import common_pb2 as common__pb2"
IMPORT_TO = "from smg_grpc_proto.generated import common_pb2 as common__pb2"


def _common() -> str:
    import smg_grpc_proto

    return str(pathlib.Path(smg_grpc_proto.__file__).parent / "proto")


def spec() -> CheckedProto:
    return CheckedProto(
        original=ORIGINAL,
        output=OUTPUT,
        sha256=SOURCE_SHA256,
        provenance=f"{SOURCE_REPO} {SOURCE_COMMIT} ({SOURCE_BRANCH}) {SOURCE_PATH}",
        script="smgrl.upstream.grpc.protos.regen",
        proto_name="psrl_vllm_engine.proto",
        source_rewrite=(PACKAGE_FROM, PACKAGE_TO),
        output_rewrite=(IMPORT_FROM, IMPORT_TO),
        includes=(_common(),),
    )


def main(argv: list[str]) -> int:
    return spec().main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
