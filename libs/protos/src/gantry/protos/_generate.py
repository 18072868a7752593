"""Generate (or check) the Python code for every .proto under protos/ with grpcio-tools.

python -m gantry.protos._generate protos libs/protos/src          # write
python -m gantry.protos._generate --check protos libs/protos/src  # fail on any difference
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc


def generate(proto_root: Path, out: Path) -> list[Path]:
    """Run protoc for every .proto file; return the generated files."""
    protos = sorted(proto_root.rglob("*.proto"))
    # the mypy plugins live beside this interpreter (the venv's bin/)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    include = str(resources.files("grpc_tools") / "_proto")
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{proto_root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated: list[Path] = []
    for proto in protos:
        package_dir = out / proto.parent.relative_to(proto_root)
        (package_dir / "__init__.py").touch()
        generated.extend(package_dir.glob(proto.stem + "_pb2*"))
    return generated


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring."""
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    proto_root, out = Path(args[0]), Path(args[1])
    if not check:
        generate(proto_root, out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(proto_root, Path(tmp))
        stale = []
        for new in files:
            committed = out / new.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(new, committed, shallow=False):
                stale.append(str(committed))
        if stale:
            print("generated protobuf code is out of date: " + ", ".join(stale))
            print("run 'make protos' and commit the result")
            return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"protobuf code up to date ({len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
