"""Regenerate the committed gRPC stubs from the .proto files (run from anywhere)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "proto").glob("*.proto"))


def generate(out_dir: Path = ROOT) -> None:
    from importlib.resources import files

    from grpc_tools import protoc

    well_known = files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    args = ["protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *PROTOS]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
