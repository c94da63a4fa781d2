"""`pip install cancel-bus` is the library alone (redis, pydantic); the node service is the
`[node]` extra, and the `cancel-bus` command says so when it is missing. The locks agree with
pyproject.toml: uv.lock (every environment, hashed) and requirements/lowest.txt (the lowest
versions the library allows)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from node.entry import NODE_EXTRA

BLOCK = f"import sys; sys.modules.update(dict.fromkeys({sorted(NODE_EXTRA)!r}))"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where no module of the [node] extra can be imported."""
    return subprocess.run(
        [sys.executable, "-c", f"{BLOCK}\n{code}"], capture_output=True, text=True, timeout=60
    )


def test_the_library_needs_only_redis_and_pydantic() -> None:
    core = [r.split(";")[0] for r in requires("cancel-bus") or [] if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("[")[0].split("<")[0] for r in core) == [
        "pydantic",
        "redis",
    ]
    done = _python("import cancel_bus; cancel_bus.CancelBus('redis://127.0.0.1:1'); print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_command_without_the_node_extra_says_how_to_get_it() -> None:
    done = _python("from node.entry import main; main()")
    assert done.returncode == 1
    assert done.stderr.strip().startswith("cancel-bus: the command needs the node service")
    assert "pip install 'cancel-bus[node]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_module_outside_the_extra_is_not_blamed_on_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['node.cli'] = None\n"
         "from node.entry import main; main()"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr
    assert "cancel-bus[node]" not in done.stderr


# -- the locks (scripts/lock writes them; scripts/_venv.sh installs from them alone) ------------

ROOT = Path(__file__).parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKED = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
UV = Path(sys.executable).parent / "uv"


def _uv_lock_check(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(UV), "lock", "--check", "--offline", "--project", str(project)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_uv_lock_agrees_with_pyproject(tmp_path: Path) -> None:
    assert _uv_lock_check(ROOT).returncode == 0, "uv.lock is stale: run ./scripts/lock"
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    changed = (tmp_path / "pyproject.toml").read_text().replace('"pyyaml>=6"', '"pyyaml>=6.0.1"')
    (tmp_path / "pyproject.toml").write_text(changed)
    assert _uv_lock_check(tmp_path).returncode != 0  # a range the lock was not made for


def test_every_locked_file_has_a_hash() -> None:
    files = [
        f
        for p in LOCKED
        if "registry" in p["source"]
        for f in [p.get("sdist"), *p.get("wheels", [])]
        if f
    ]
    assert files and all(f["hash"].startswith("sha256:") for f in files)


def _lowest() -> dict[str, str]:
    text = (ROOT / "requirements" / "lowest.txt").read_text()
    return dict(re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", text, re.M))


def test_the_lowest_versions_job_installs_the_lower_bounds_of_the_library_ranges() -> None:
    pinned = _lowest()
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        assert lower, f"{requirement.name} has no lower bound to test"
        assert Version(pinned[requirement.name]) == Version(lower[0]), requirement.name


def test_the_lowest_versions_job_runs_the_test_tools_uv_lock_pins() -> None:
    locked = {p["name"]: p["version"] for p in LOCKED}
    pinned = _lowest()
    for line in PYPROJECT["dependency-groups"]["test-library"]:
        name = Requirement(line).name
        assert pinned[name] == locked[name], f"{name}: requirements/lowest.txt is stale"
