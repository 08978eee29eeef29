"""Regenerate PSManager's messages (``psrl_manager_pb2.py``) from the checked-in ``.proto``.

``psrl_manager.proto.orig`` is PSRL's SMG fork's file byte for byte (provenance below; its sha256
is verified before generating); ``protoc`` generates the messages unchanged (proto package
``psrl.state``, RPC paths ``/psrl.state.PSManagerState/<Method>``).

Run ``python -m smgrl.upstream.psmanager.regen`` (needs ``grpcio-tools``, in the test extra);
``--check`` exits 1 if the checked-in module is not what it generates.
"""

from __future__ import annotations

import pathlib
import sys

from smgrl.upstream.grpc.protos.checked import CheckedProto

SOURCE_REPO = "github.com/Somoku/smg"
SOURCE_BRANCH = "psrl-dev"
SOURCE_COMMIT = "7169017bb38a3281825a639aa352b044ed69d3e5"
SOURCE_PATH = "crates/psrl_state/proto/psrl_manager.proto"
SOURCE_SHA256 = "979f72d9c13408dafcaf0862015245af00afedeb7de1d6ae3d177f0f55c7bc6f"

HERE = pathlib.Path(__file__).resolve().parent
ORIGINAL = HERE / "psrl_manager.proto.orig"
OUTPUT = HERE / "psrl_manager_pb2.py"

SPEC = CheckedProto(
    original=ORIGINAL,
    output=OUTPUT,
    sha256=SOURCE_SHA256,
    provenance=f"{SOURCE_REPO} {SOURCE_COMMIT} ({SOURCE_BRANCH}) {SOURCE_PATH}",
    script="smgrl.upstream.psmanager.regen",
    proto_name="psrl_manager.proto",
)


def main(argv: list[str]) -> int:
    return SPEC.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
