"""`pip install cancel-bus` is the library alone (redis, pydantic); the node service is the
`[node]` extra, and the `cancel-bus` command says so when it is missing."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires

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
