"""Just enough of a kubelet to run a rendered pod spec's container as a local process.

What it does as the kubelet would: the container's command and args, ``envFrom`` ConfigMaps,
``env`` in order with ``$(VAR)`` expansion, the downward API (``metadata.name``/``namespace``),
``secretKeyRef``/``configMapKeyRef`` (a missing non-optional key is an error), Secret and emptyDir
volumes, the startup and readiness probes (HTTP GET on the named port, 200-399, within
``periodSeconds x failureThreshold``), and termination: the preStop sleep (the pod keeps serving),
SIGTERM, SIGKILL when ``terminationGracePeriodSeconds`` runs out.

What differs, because the pods share this machine: each pod listens on its own loopback port
(``CANCEL_BUS_PORT``/``HOST`` are overridden; the probes follow), a volume's mountPath is rewritten
to a local directory in env values (an emptyDir at /tmp becomes ``TMPDIR``), Service names are
rewritten to a pod's address by the caller. With root and util-linux, the security context is
enforced: a read-only root filesystem (emptyDirs are tmpfs mounts), no capabilities, no new
privileges. ``runAsUser`` is not: the interpreter may live under /root.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from node.embedded import free_port

Doc = dict[str, Any]
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, defined: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``,
    unknown references stay as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return defined.get(match.group(1), match.group(0))

    return _REF.sub(one, value)


def secrets_of(docs: list[Doc]) -> dict[str, dict[str, str]]:
    """The rendered Secrets' contents by name."""
    found: dict[str, dict[str, str]] = {}
    for doc in docs:
        if doc["kind"] == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
            data.update(doc.get("stringData") or {})
            found[doc["metadata"]["name"]] = data
    return found


def configmaps_of(docs: list[Doc]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}


@functools.cache
def sandbox_available() -> bool:
    """Root with unshare and setpriv, and mount namespaces allowed here."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0


@dataclass
class LocalPod:
    """One pod of a rendered Deployment (or a bare Pod), its first container run locally."""

    name: str
    spec: Doc  # the pod spec
    namespace: str
    secrets: dict[str, dict[str, str]]
    configmaps: dict[str, dict[str, str]]
    workdir: Path
    container_name: str | None = None
    rewrites: dict[str, str] = field(default_factory=dict)  # e.g. a Service host -> a pod's
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    sandboxed: bool = False

    @property
    def container(self) -> Doc:
        containers: list[Doc] = self.spec["containers"]
        if self.container_name is None:
            return containers[0]
        return next(c for c in containers if c["name"] == self.container_name)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    # -- the environment --------------------------------------------------------------------

    def volumes(self) -> dict[str, Path]:
        """mountPath -> the local directory standing for it."""
        by_name = {v["name"]: v for v in self.spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for mount in self.container.get("volumeMounts", []):
            volume = by_name[mount["name"]]
            local = self.workdir / self.name / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                data = self.secrets[volume["secret"]["secretName"]]
                for key, text in data.items():
                    (local / key).write_text(text)
            else:
                assert "emptyDir" in volume, f"volume type not emulated: {volume}"
            mounts[mount["mountPath"]] = local
        return mounts

    def _value_from(self, source: Doc) -> str | None:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            fields = {"metadata.name": self.name, "metadata.namespace": self.namespace}
            fields["status.podIP"] = "127.0.0.1"
            return fields[path]
        for kind, store in (("secretKeyRef", self.secrets), ("configMapKeyRef", self.configmaps)):
            if kind in source:
                ref = source[kind]
                data = store.get(ref["name"], {})
                if ref["key"] in data:
                    return data[ref["key"]]
                if ref.get("optional"):
                    return None
                raise KeyError(f"{kind} {ref['name']}/{ref['key']} does not exist")
        raise AssertionError(f"valueFrom not emulated: {source}")

    def env(self) -> dict[str, str]:
        """The container's environment as the kubelet builds it (before the local overrides)."""
        env: dict[str, str] = {}
        for source in self.container.get("envFrom", []):
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self.configmaps[source["configMapRef"]["name"]]
            else:
                data = self.secrets[source["secretRef"]["name"]]
            env.update({prefix + k: v for k, v in data.items()})
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(str(var["value"]), env)
            else:
                value = self._value_from(var["valueFrom"])
                if value is not None:
                    env[var["name"]] = value
        return env

    def _local(self, text: str, mounts: dict[str, Path]) -> str:
        for path, local in mounts.items():
            text = text.replace(path.rstrip("/") + "/", f"{local}/")
        for old, new in self.rewrites.items():
            text = text.replace(old, new)
        return text

    def command(self, env: dict[str, str]) -> list[str]:
        argv = [expand(a, env) for a in self.container.get("command", [])]
        argv += [expand(a, env) for a in self.container.get("args", [])]
        assert argv, "the container must say what it runs (the image's entrypoint is not here)"
        found = shutil.which(argv[0], path=str(Path(sys.executable).parent)) or shutil.which(
            argv[0]
        )
        assert found, f"{argv[0]} not found"
        return [found, *argv[1:]]

    # -- the life of the pod ----------------------------------------------------------------

    def start(self, overrides: dict[str, str] | None = None) -> LocalPod:
        mounts = self.volumes()
        env = {k: self._local(v, mounts) for k, v in self.env().items()}
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
        env.update(overrides or {})
        argv = self.command(env)
        base = {k: v for k, v in os.environ.items() if not k.startswith("CANCEL_BUS_")}
        argv = self._sandboxed(argv, [mounts[p] for p in mounts if self._is_empty_dir(p)])
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                env={**base, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def _is_empty_dir(self, mount_path: str) -> bool:
        by_name = {v["name"]: v for v in self.spec.get("volumes", [])}
        mount = next(m for m in self.container["volumeMounts"] if m["mountPath"] == mount_path)
        return "emptyDir" in by_name[mount["name"]]

    def _sandboxed(self, argv: list[str], writable: list[Path]) -> list[str]:
        context = self.container.get("securityContext", {})
        if not (context.get("readOnlyRootFilesystem") and sandbox_available()):
            return argv
        self.sandboxed = True
        steps = ["mount -o remount,bind,ro /"]
        steps += [f"mount -t tmpfs -o size=64m tmpfs {shlex.quote(str(d))}" for d in writable]
        privileges = ["setpriv"]
        if context.get("allowPrivilegeEscalation") is False:
            privileges.append("--no-new-privs")
        if "ALL" in context.get("capabilities", {}).get("drop", []):
            privileges += ["--inh-caps=-all", "--bounding-set=-all"]
        script = " && ".join(steps) + ' && exec "$@"'
        unshare = ["unshare", "--mount", "--propagation", "private"]
        return [*unshare, "sh", "-c", script, "sh", *privileges, "--", *argv]

    def run_to_completion(self, overrides: dict[str, str], timeout: float) -> int:
        self.start(overrides)
        assert self.process is not None
        return self.process.wait(timeout)

    def _probe_ok(self, probe: Doc) -> bool:
        get = probe["httpGet"]
        ports = {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}
        assert get["port"] in ports or isinstance(get["port"], int), get
        try:
            answer = httpx.get(f"{self.url}{get['path']}", timeout=probe.get("timeoutSeconds", 1))
        except httpx.HTTPError:
            return False
        return 200 <= answer.status_code < 400

    def _await_probe(self, kind: str) -> float:
        """Poll a probe (faster than the kubelet would) until it passes; fail past the budget the
        kubelet would allow. Returns the seconds it took."""
        probe = self.container[kind]
        budget = probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get(
            "failureThreshold", 3
        )
        t0 = time.monotonic()
        while not self._probe_ok(probe):
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_path.read_text()[-3000:]}")
            if time.monotonic() - t0 > budget:
                raise AssertionError(f"{self.name}: {kind} failed for {budget}s (kubelet gives up)")
            time.sleep(0.05)
        return time.monotonic() - t0

    def wait_ready(self) -> LocalPod:
        self._await_probe("startupProbe")
        self._await_probe("readinessProbe")
        return self

    def ready(self) -> bool:
        return self._probe_ok(self.container["readinessProbe"])

    def terminate(self, on_sigterm: Callable[[], None] = lambda: None) -> tuple[float, int]:
        """Delete the pod as the kubelet does: preStop (the pod keeps serving: it must stay
        ready), SIGTERM (then ``on_sigterm()``), SIGKILL at the end of the grace period. Returns
        the seconds from the deletion to the exit, and the exit code."""
        assert self.process is not None
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        t0 = time.monotonic()
        pre_stop = self.container.get("lifecycle", {}).get("preStop", {})
        seconds = pre_stop.get("sleep", {}).get("seconds", 0)
        if "exec" in pre_stop:
            assert pre_stop["exec"]["command"][0] == "sleep", pre_stop
            seconds = float(pre_stop["exec"]["command"][1])
        while time.monotonic() - t0 < seconds:  # the hook's sleep, watching the pod serve
            assert self.ready(), f"{self.name} stopped being ready during the preStop sleep"
            time.sleep(0.1)
        self.process.send_signal(signal.SIGTERM)
        on_sigterm()
        try:
            code = self.process.wait(max(0.0, grace - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.name} still running after {grace}s: SIGKILLed") from None
        return time.monotonic() - t0, code

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
