"""`python -m tpuflow.models.build NAME -o file.onnx`: write a bundled model to an ONNX file."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tpuflow.errors import TpuflowError
from tpuflow.models import build_model, describe, names


def write_model(name: str, path: Path) -> int:
    """Build `name` and write it atomically (temp file in the target directory, then rename)."""
    data = build_model(name).SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuflow.models.build",
                                     description="Write a bundled tpuflow model to an ONNX file.")
    parser.add_argument("name", nargs="?", help="bundled model name (omit with --list)")
    parser.add_argument("-o", "--output", type=Path, help="ONNX file to write (default: NAME.onnx)")
    parser.add_argument("--list", action="store_true", help="list the bundled models")
    args = parser.parse_args(argv)
    if args.list or not args.name:
        for n in names():
            print(f"{n:14s} {describe(n)}")
        return 0 if args.list else 2
    out = args.output or Path(f"{args.name}.onnx")
    try:
        size = write_model(args.name, out)
    except TpuflowError as exc:
        print(f"build: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"build: error: {out}: cannot write: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
