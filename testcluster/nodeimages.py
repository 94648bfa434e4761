"""Images for the real nodes (:mod:`realnode`), which reach no registry: the sandbox ("pause") image made
here from the ``pause`` binary ``hack/cluster/build.sh`` builds, and the OCI archives of ``make images``
(``hack/images/build.sh``), imported into a node's containerd as a node would pull them.

Names are what the kubelet asks the CRI for: ``ddpjob/trainer:0.1.0`` in a pod spec is
``docker.io/ddpjob/trainer:0.1.0`` to it, so that is the name an archive is imported under.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import warnings
from pathlib import Path

from .layout import REPO_ROOT

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # the name containerd's CRI asks for (its sandbox_image)
IMAGE_BUILD_SCRIPT = REPO_ROOT / "hack" / "images" / "build.sh"
IMAGE_CACHE = Path(os.environ.get("DDPJOB_IMAGE_CACHE") or Path.home() / ".cache" / "ddpjob" / "images")


def _blob(layout_tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    layout_tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", len(data)


def write_pause_archive(pause_binary: Path, target: Path) -> Path:
    """An OCI image archive of one layer, ``/pause`` (ENTRYPOINT), named :data:`PAUSE_IMAGE`."""
    layer_raw = io.BytesIO()
    with tarfile.open(fileobj=layer_raw, mode="w", format=tarfile.PAX_FORMAT) as layer:
        info = tarfile.TarInfo("pause")
        data = pause_binary.read_bytes()
        info.size, info.mode = len(data), 0o755
        layer.addfile(info, io.BytesIO(data))
    raw = layer_raw.getvalue()
    compressed = gzip.compress(raw, mtime=0)
    with tarfile.open(target, "w") as out:
        layer_digest, layer_size = _blob(out, compressed)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
        }
        config_digest, config_size = _blob(out, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": layer_size,
                }
            ],
        }
        manifest_digest, manifest_size = _blob(out, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE},
                }
            ],
        }
        for name, body in (("index.json", index), ("oci-layout", {"imageLayoutVersion": "1.0.0"})):
            data = json.dumps(body).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return target


def image_archives() -> dict[str, Path] | str:
    """``make images``' archives ({"operator": path, "trainer": path}): those of the current inputs (the
    script's ``--check`` finds them without building), else the newest built, with a warning (the trainer
    is a 5-minute, 3.3 GB build, and every commit to ``operator/`` changes the inputs; what the real-node
    tests check comes from the Dockerfile), else why there are none."""
    result = subprocess.run(
        ["bash", str(IMAGE_BUILD_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        out = Path(result.stdout.strip())
        return {name: out / f"{name}.tar" for name in ("operator", "trainer")}
    targets = ("operator", "trainer")
    built = [d for d in IMAGE_CACHE.glob("*/") if all((d / f"{n}.tar").exists() for n in targets)]
    if not built:
        return f"no image archives in {IMAGE_CACHE}: run `make images` ({result.stderr.strip()})"
    newest = max(built, key=lambda d: (d / "trainer.tar").stat().st_mtime)
    warnings.warn(
        f"the images of the current inputs are not built; using the newest built, {newest} "
        f"(`make images` builds the current ones)",
        stacklevel=2,
    )
    return {name: newest / f"{name}.tar" for name in ("operator", "trainer")}


def ctr(socket: Path, *args: str, timeout: float = 900) -> str:
    result = subprocess.run(
        ["ctr", f"--address={socket}", "--namespace=k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _manifest(archive: Path) -> tuple[str, str]:
    """The archive's one image: (its manifest's digest, its ref name, as buildah writes it)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        entry = json.load(member)["manifests"][0]
    return str(entry["digest"]), str(entry["annotations"]["org.opencontainers.image.ref.name"])


def import_image(socket: Path, archive: Path, name: str) -> bool:
    """Imports ``archive`` as ``name`` unless the node holds that very manifest under that name already (an
    import of the 3.3 GB trainer takes minutes); returns whether it imported. ctr names the image after the
    archive's ref (``ddpjob/trainer:0.1.0``); a tag then gives it the name the kubelet asks for."""
    digest, ref = _manifest(archive)
    drop_unnamed(socket)
    listed = ctr(socket, "images", "ls")
    if any(line.split()[:1] == [name] and digest in line for line in listed.splitlines()):
        return False
    # An older build under these names goes first: retagged over, its snapshots (~6 GB for the trainer)
    # would stay on the disk; deleted, containerd's GC frees them (nodeconfig: deletion_threshold = 1).
    held = {line.split()[0] for line in listed.splitlines()[1:] if line.split()}
    stale = [n for n in (name, ref) if n in held]
    if stale:
        ctr(socket, "images", "rm", "--sync", *stale)
    ctr(socket, "images", "import", f"--base-name={ref.rsplit(':', 1)[0]}", str(archive))
    if ref != name:
        ctr(socket, "images", "tag", "--force", ref, name)
    drop_unnamed(socket)  # CRI's record of the build this one replaced
    return True


def drop_unnamed(socket: Path) -> list[str]:
    """Deletes the records CRI keeps of images no name points at any more. CRI names every image it has
    served by its config digest too (``sha256:<config>``); when an import gives the names to a newer
    build, that record alone kept the older build's snapshots (the trainer's 5.6 GB layer) on the disk:
    each node held 18 GB after two rebuilds instead of 6.1. Returns the records deleted."""
    rows = [line.split() for line in ctr(socket, "images", "ls").splitlines()[1:] if line.split()]
    named = {row[2] for row in rows if not row[0].startswith("sha256:")}
    orphans = [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in named]
    if orphans:
        ctr(socket, "images", "rm", "--sync", *orphans)
    return orphans


def drop_layer_blobs(socket: Path, name: str) -> int:
    """Deletes the compressed layers of image ``name`` from the node's content store once they are
    unpacked, as containerd's CRI does with ``discard_unpacked_layers`` for the images it pulls: containers
    start from the snapshots, which the image's config still holds, so the node keeps one copy (the
    trainer: 6.2 GB, not 9.5). Returns how many blobs went."""
    target = next(
        (line.split()[2] for line in ctr(socket, "images", "ls").splitlines()[1:] if line.split()[0] == name),
        None,
    )
    if target is None:
        raise RuntimeError(f"no image {name} on the node ({socket})")
    manifest = json.loads(ctr(socket, "content", "get", target))
    dropped = 0
    for layer in manifest["layers"]:
        with contextlib.suppress(RuntimeError):  # gone already
            ctr(socket, "content", "rm", layer["digest"])
            dropped += 1
    return dropped
