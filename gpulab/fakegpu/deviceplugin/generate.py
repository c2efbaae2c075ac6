"""Regenerate the committed gRPC stubs from ``api.proto``.

    python -m gpulab.fakegpu.deviceplugin.generate [OUT_DIR]

Needs grpcio-tools (a dev dependency); the generated modules need only grpcio
and protobuf at run time. The proto is compiled under its repository path so
that its descriptor has a unique name in protobuf's global pool, and the
import that ``api_pb2_grpc.py`` makes of ``api_pb2`` is rewritten to a
package-relative one.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import resources
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO = PACKAGE_DIR / "api.proto"
# The directory that contains the top-level ``gpulab`` package.
_IMPORT_ROOT = PACKAGE_DIR.parents[2]
_PROTO_RELATIVE = PROTO.relative_to(_IMPORT_ROOT)
_PACKAGE = ".".join(_PROTO_RELATIVE.parent.parts)

STUB_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def render() -> dict[str, str]:
    """Compile ``api.proto`` and return the stub files as ``{name: text}``."""
    from grpc_tools import protoc  # dev-only dependency, imported on demand

    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="gpulab-protoc-") as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{_IMPORT_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(_PROTO_RELATIVE),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {PROTO}")
        generated = Path(tmp) / _PROTO_RELATIVE.parent
        files = {name: (generated / name).read_text() for name in STUB_FILES}
    files["api_pb2_grpc.py"] = _relative_import(files["api_pb2_grpc.py"])
    return files


def _relative_import(text: str) -> str:
    absolute = f"from {_PACKAGE} import api_pb2 as "
    if absolute not in text:
        raise RuntimeError(f"unexpected grpc stub layout: no {absolute!r} line")
    return text.replace(absolute, "from . import api_pb2 as ")


def generate(out_dir: Path | str = PACKAGE_DIR) -> list[Path]:
    """Write the stub files into ``out_dir`` and return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for path in generate(args[0] if args else PACKAGE_DIR):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
