"""The test cluster's own images, built here with no registry: the pod sandbox's pause image
and a tiny workload image, both the one static binary ``tools/envtest/podbin`` (Go).

``build_images()`` compiles podbin (cached by the hash of its source under
``$CFNET_CACHE/envtest/podbin-<hash>/``) and writes one OCI image archive per image (an
uncompressed single-layer image, ``index.json`` naming it) that ``ctr images import`` loads
into containerd. Nothing is pulled from anywhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PODBIN_SRC = HERE / "podbin"
CACHE = Path(os.environ.get("CFNET_CACHE", "/var/cache/cfnet")) / "envtest"

PAUSE_IMAGE = "cfnet.local/pause:1"
PODBIN_IMAGE = "cfnet.local/podbin:1"


class ImageError(RuntimeError):
    """An image of the test cluster could not be built."""


@dataclass(frozen=True)
class Image:
    name: str
    archive: Path


def _source_hash() -> str:
    h = hashlib.sha256()
    for f in sorted(PODBIN_SRC.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _blob(layout: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode = len(data), 0o644
    layout.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def _layer(binary: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for d in ("bin", "etc", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            t.addfile(info)
        info = tarfile.TarInfo("bin/podbin")
        info.size, info.mode = len(binary), 0o755
        t.addfile(info, io.BytesIO(binary))
    return buf.getvalue()


def write_archive(path: Path, name: str, binary: bytes, entrypoint: list[str]) -> None:
    """An OCI image layout tar holding one image ``name`` (one layer: /bin/podbin)."""
    layer = _layer(binary)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as t:
        layer_digest = _blob(t, layer)
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": entrypoint, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }, sort_keys=True).encode()
        config_digest = _blob(t, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": len(layer)}],
        }, sort_keys=True).encode()
        manifest_digest = _blob(t, manifest)
        index = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name},
            }],
        }).encode()
        for fname, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                            ("index.json", index)):
            info = tarfile.TarInfo(fname)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def build_images() -> list[Image]:
    """Build (or find cached) the pause and podbin image archives."""
    out = CACHE / f"podbin-{_source_hash()}"
    binary = out / "podbin"
    images = [Image(PAUSE_IMAGE, out / "pause.oci.tar"),
              Image(PODBIN_IMAGE, out / "podbin.oci.tar")]
    if all(i.archive.exists() for i in images):
        return images
    out.mkdir(parents=True, exist_ok=True)
    if not binary.exists():
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
        r = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o",
                            str(binary) + ".tmp", "."], cwd=PODBIN_SRC, env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ImageError(f"go build of tools/envtest/podbin failed:\n{r.stderr}")
        Path(str(binary) + ".tmp").replace(binary)
    data = binary.read_bytes()
    write_archive(images[0].archive, PAUSE_IMAGE, data, ["/bin/podbin", "pause"])
    write_archive(images[1].archive, PODBIN_IMAGE, data, ["/bin/podbin"])
    return images
