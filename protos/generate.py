"""Regenerate the Python modules of `protos/draftstore/v1/draftstore.proto`.

    python -m protos.generate            # into the repository (the committed modules)
    python -m protos.generate --out DIR  # into DIR/protos/draftstore/v1/ (the test diffs the two)

Runs exactly `python -m grpc_tools.protoc -I . --python_out=OUT --pyi_out=OUT --grpc_python_out=OUT
protos/draftstore/v1/draftstore.proto` from the repository root, so the generated imports read
`from protos.draftstore.v1 import draftstore_pb2`.

Dependency floors the generated code checks at import time (grpcio-tools 1.85.1 / protoc 7.35.1):
`protobuf>=7.35.1,<8` (ValidateProtobufRuntimeVersion: same major, runtime >= gencode) and
`grpcio>=1.85.1` (GRPC_GENERATED_VERSION in the _grpc module).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO = "protos/draftstore/v1/draftstore.proto"
GENERATED = ("draftstore_pb2.py", "draftstore_pb2.pyi", "draftstore_pb2_grpc.py")


def generate(out: Path | str = REPO) -> list[Path]:
    """Write the generated modules under `out` (same relative layout); return their paths."""
    from grpc_tools import protoc  # dev dependency (grpcio-tools); not needed to serve

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc", f"-I{REPO}", f"--python_out={out}", f"--pyi_out={out}",
        f"--grpc_python_out={out}", str(REPO / PROTO),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc} on {PROTO}")
    folder = out / Path(PROTO).parent
    return [folder / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO), help="root to write into (default: the repo)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
