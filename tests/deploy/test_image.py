"""The Dockerfile and .dockerignore, read (no Docker engine here): the install step is CI's, the
final stage is slim and non-root and runs what the chart runs, the build context holds what the
locked install needs and nothing else."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import tomllib

import yaml

from cancel_bus._keys import KeySpace
from node import health
from node.app import create_app
from node.settings import Settings

from .helm import CHART, REPO

Stage = list[tuple[str, str]]  # (instruction, arguments)


def stages() -> list[Stage]:
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    found: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            found.append([])
        if found:
            found[-1].append((instruction.upper(), arguments.strip()))
    return found


def test_multi_stage_slim_non_root_final_stage() -> None:
    build, final = stages()
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert base and re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base.group(1))
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    runs = " ".join(arguments for kind, arguments in final if kind == "RUN")
    assert not re.search(r"apt-get|apk|gcc|build-essential|pip install", runs)  # no build tools
    copies = [arguments for kind, arguments in final if kind == "COPY"]
    assert copies == ["--from=build /opt/cancel-bus /opt/cancel-bus"]  # the virtualenv only
    pod = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    (user,) = [arguments for kind, arguments in final if kind == "USER"]
    assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}" and pod["runAsUser"] > 0


def test_install_step_is_the_one_ci_runs() -> None:
    """scripts/_venv.sh (what .ci/run uses): uv bootstrapped by the hashes uv.lock pins, then
    ``uv sync --locked``; the image does the same with what scripts/serve syncs, not editable
    and without the tools."""
    ci = (REPO / "scripts" / "_venv.sh").read_text()
    assert re.search(r"scripts/locked_uv\.py", ci) and "--require-hashes" in ci
    assert re.search(r'bin/uv" sync --locked ', ci)
    serve = re.search(r"^ensure_venv (.*)$", (REPO / "scripts" / "serve").read_text(), re.M)
    assert serve
    runs = " ".join(arguments for kind, arguments in stages()[0] if kind == "RUN")
    assert "python scripts/locked_uv.py" in runs and "--require-hashes" in runs
    (image_sync,) = re.findall(r"uv sync ([^&]*?)\s*(?:&&|$)", runs)
    expected = set(serve.group(1).split()) - {"--inexact"}
    assert set(image_sync.split()) == expected | {
        "--locked",
        "--quiet",
        "--no-dev",
        "--no-editable",
    }


def test_entrypoint_is_what_the_chart_runs_and_healthcheck_is_the_liveness_route() -> None:
    final = stages()[-1]
    entry = dict(final)
    command = json.loads(entry["ENTRYPOINT"]) + json.loads(entry["CMD"])
    assert command == ["cancel-bus", "serve"]  # tests/deploy/test_chart.py: the Deployment's too
    app = create_app(Settings(redis_url="redis://unused"))
    assert entry["HEALTHCHECK"].count(app.url_path_for(health.healthz.__name__)) == 1
    assert "EXPOSE" in entry and entry["EXPOSE"] == str(Settings.model_fields["port"].default)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore: the last matching pattern wins; a directory's pattern covers what
    is inside it; ``**/`` matches any depth, including none."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        body = pattern.removeprefix("!").rstrip("/")
        variants = {body, body.removeprefix("**/")}
        if any(fnmatch.fnmatchcase(p, v) for p in prefixes for v in variants):
            ignored = not pattern.startswith("!")
    return ignored


def test_build_context_holds_what_pip_needs_and_nothing_else() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    context = {path for path in listed if not _ignored(path, patterns)}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "uv.lock", "scripts/locked_uv.py", project["project"]["readme"]}
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed |= {p for p in listed if p.split("/")[0] in packages and "__pycache__" not in p}
    assert needed <= context, f"missing from the build context: {needed - context}"
    assert context <= needed, f"not needed in the image: {sorted(context - needed)[:10]}"
    assert _ignored("node/__pycache__/app.cpython-311.pyc", patterns)
    assert _ignored(".venv/bin/python", patterns) and _ignored(".git/HEAD", patterns)


def test_the_documented_acl_is_the_librarys() -> None:
    docs = (REPO / "docs" / "deploy.md").read_text()
    assert f"ACL SETUSER cancel-bus on >PASSWORD {KeySpace('cancel-bus').acl_rules()}\n" in docs
