"""The Helm chart, rendered: lint, Kubernetes API schemas, the schema's rejections, and what the
rendered objects promise the app (its routes, its settings, its drain)."""

from __future__ import annotations

import json
import os
import re
import typing
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from node import health
from node.app import create_app
from node.settings import ENV_PREFIX, Settings

from .helm import (
    CHART,
    CURRENT_KUBE,
    MIN_KUBE,
    Doc,
    kubernetes_validate,
    lint,
    merge,
    one,
    render,
    run_helm,
    template,
)
from .kubelet import LocalPod, configmaps_of, secrets_of

DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
SETTINGS_ENV = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
SECRET_ENV = {"CANCEL_BUS_API_TOKENS", "CANCEL_BUS_SIGNING_KEY", "REDIS_PASSWORD", "REDIS_USERNAME"}
TOKENS = [
    {"token": "ops-token-4f1c9a7e2b6d0835", "role": "ops", "name": "on-call"},
    {"token": "alice-token-9d2e7b4a1c6f3058", "role": "user", "userId": "alice"},
]
INLINE_PASSWORD = "inline-redis-password-7c3e91"
SENTINELS = ["sentinel-0.sentinel:26379", "sentinel-1.sentinel:26379", "sentinel-2.sentinel:26379"]
SHARDS = ["redis-0.redis:6379", "redis-1.redis:6379", "redis-2.redis:6379"]

# name -> (values, the CANCEL_BUS_REDIS_URL they render, kubelet-expanded with REDIS_* = U/P)
VALUE_SETS: dict[str, tuple[dict[str, Any], str | None]] = {
    "defaults": ({}, "redis://redis:6379/0"),
    "external-tls-acl-existing-secrets": (
        {
            "redis": {
                "url": "rediss://redis.prod.internal:6380/2",
                "auth": {
                    "existingSecret": "redis-credentials",
                    "usernameKey": "username",
                    "passwordKey": "password",
                },
                "tls": {
                    "enabled": True,
                    "existingSecret": "redis-tls",
                    "certKey": "tls.crt",
                    "keyKey": "tls.key",
                },
            },
            "auth": {"existingSecret": "cancel-bus-tokens"},
            "signingKey": {"existingSecret": "cancel-bus-signing"},
        },
        "rediss://U:P@redis.prod.internal:6380/2?ssl_ca_certs=/etc/cancel-bus/redis-tls/ca.crt"
        "&ssl_certfile=/etc/cancel-bus/redis-tls/tls.crt&ssl_keyfile=/etc/cancel-bus/redis-tls/"
        "tls.key&ssl_cert_reqs=required",
    ),
    "sentinel": (
        {
            "redis": {
                "mode": "sentinel",
                "sentinel": {"masterName": "mymaster", "addresses": SENTINELS, "db": 1},
                "auth": {"username": "cancel-bus", "existingSecret": "redis-credentials"},
                "tls": {"enabled": True, "existingSecret": "redis-tls", "checkHostname": False},
            }
        },
        "rediss+sentinel://cancel-bus:P@" + ",".join(SENTINELS) + "/mymaster/1"
        "?ssl_ca_certs=/etc/cancel-bus/redis-tls/ca.crt&ssl_cert_reqs=required"
        "&ssl_check_hostname=false",
    ),
    "cluster": (
        {"redis": {"mode": "cluster", "cluster": {"addresses": SHARDS}}},
        "redis+cluster://" + ",".join(SHARDS),
    ),
    "auth-on": (
        {
            "auth": {"tokens": TOKENS, "generateOpsToken": False},
            "redis": {"url": "redis://redis.data:6379/0", "auth": {"password": INLINE_PASSWORD}},
            "config": {"retention": 1_000_000, "maxBodyBytes": 1_048_576, "drainTimeout": 30.5},
        },
        f"redis://:{INLINE_PASSWORD}@redis.data:6379/0",
    ),
    "hpa-servicemonitor-networkpolicy-ingress": (
        {
            "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12},
            "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
            "config": {"metricsRequireToken": True},
            "networkPolicy": {"enabled": True, "redisTo": [{"ipBlock": {"cidr": "10.20.0.0/24"}}]},
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "tls": [{"secretName": "cb-tls", "hosts": ["cancel-bus.example.com"]}],
            },
            "redis": {"url": "redis://redis.data:6380/0"},
        },
        "redis://redis.data:6380/0",
    ),
    "in-chart-redis": (
        {
            "redis": {"inChart": {"enabled": True, "persistence": {"enabled": True}}},
            "networkPolicy": {"enabled": True},
        },
        None,  # the generated password: checked by its own test
    ),
    "url-from-secret": (
        {
            "redis": {
                "urlFromSecret": {"name": "redis-url", "key": "url"},
                "tls": {"enabled": True, "existingSecret": "redis-tls"},
            },
            "preStopSleepSeconds": 0,
            "terminationGracePeriodSeconds": 120,
        },
        "rediss://from-the-secret",
    ),
}
REDIS_PORTS = {"hpa-servicemonitor-networkpolicy-ingress": {6380}, "in-chart-redis": {6379}}
# Secrets the value sets name but do not create (the user's own), with test contents.
EXISTING_SECRETS = {
    "redis-credentials": {"username": "U", "password": "P", "redis-password": "P"},
    "redis-tls": {"ca.crt": "CA", "tls.crt": "CERT", "tls.key": "KEY"},
    "cancel-bus-tokens": {"api-tokens": json.dumps({t["token"]: {"role": "ops"} for t in TOKENS})},
    "cancel-bus-signing": {"signing-key": "a-signing-key-from-an-existing-secret"},
    "redis-url": {"url": "rediss://from-the-secret"},
}

REJECTED: dict[str, tuple[dict[str, Any], str]] = {
    "negative drain": ({"config": {"drainTimeout": -1}}, "drainTimeout"),
    "unknown log level": ({"config": {"logLevel": "verbose"}}, "logLevel"),
    "namespace with a space": ({"config": {"namespace": "my ns"}}, "namespace"),
    "lease below the app's floor": ({"config": {"leaseTtl": 0.1}}, "leaseTtl"),
    "replicas as a string": ({"replicaCount": "3"}, "replicaCount"),
    "misspelt key": ({"replicas": 3}, "replicas"),
    "password in the URL": ({"redis": {"url": "redis://:hunter2@redis:6379/0"}}, "url"),
    "TLS on a redis:// URL": ({"redis": {"tls": {"enabled": True}}}, "url"),
    "no Redis at all": ({"redis": {"url": ""}}, "url"),
    "sentinel without sentinels": ({"redis": {"mode": "sentinel"}}, "addresses"),
    "cluster without seeds": ({"redis": {"mode": "cluster"}}, "addresses"),
    "bad sentinel address": (
        {"redis": {"mode": "sentinel", "sentinel": {"addresses": ["sentinel-0"]}}},
        "addresses",
    ),
    "in-chart Redis in cluster mode": (
        {
            "redis": {
                "inChart": {"enabled": True},
                "mode": "cluster",
                "cluster": {"addresses": SHARDS},
            }
        },
        "mode",
    ),
    "in-chart Redis and a URL Secret": (
        {"redis": {"inChart": {"enabled": True}, "urlFromSecret": {"name": "redis-url"}}},
        "name",
    ),
    "client cert without key": (
        {"redis": {"tls": {"existingSecret": "t", "certKey": "tls.crt"}}},
        "keyKey",
    ),
    "short token": ({"auth": {"tokens": [{"token": "short", "role": "ops"}]}}, "token"),
    "user token without a user": (
        {"auth": {"tokens": [{"token": "t" * 20, "role": "user"}]}},
        "userId",
    ),
    "a setting through extraEnv": (
        {"extraEnv": [{"name": "CANCEL_BUS_REDIS_URL", "value": "redis://elsewhere"}]},
        "extraEnv",
    ),
    "no tokens at all": ({"auth": {"generateOpsToken": False}}, "no API tokens"),
    "grace period shorter than the drain": (
        {"terminationGracePeriodSeconds": 30},
        "terminationGracePeriodSeconds",
    ),
    "startup probe shorter than a lease": (
        {"probes": {"startup": {"failureThreshold": 5}}},
        "probes.startup",
    ),
    "autoscaling max below min": (
        {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        "maxReplicas",
    ),
    "metrics token without a token": (
        {
            "config": {"metricsRequireToken": True},
            "metrics": {"serviceMonitor": {"enabled": True}},
            "auth": {"existingSecret": "mine"},
        },
        "metricsRequireToken",
    ),
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, helm: Path) -> tuple[str, list[Doc]]:
    name: str = request.param
    return name, template(VALUE_SETS[name][0], kube_version=CURRENT_KUBE)


def node_container(docs: list[Doc]) -> Doc:
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "node")


def node_config(docs: list[Doc]) -> dict[str, str]:
    """The ConfigMap the node container takes its settings from (envFrom)."""
    (source,) = node_container(docs)["envFrom"]
    return configmaps_of(docs)[source["configMapRef"]["name"]]


def local_pod(docs: list[Doc], tmp_path: Path) -> LocalPod:
    return LocalPod(
        name="cb-cancel-bus-6c9f8d7b5-x2k9p",
        spec=one(docs, "Deployment")["spec"]["template"]["spec"],
        namespace="cb",
        secrets={**EXISTING_SECRETS, **secrets_of(docs)},
        configmaps=configmaps_of(docs),
        workdir=tmp_path,
    )


def test_helm_is_v4(helm: Path) -> None:
    version = run_helm("version", "--short").stdout
    assert version.startswith("v4."), version


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict(helm: Path, name: str) -> None:
    result = lint(VALUE_SETS[name][0])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("kube", [MIN_KUBE, CURRENT_KUBE])
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_manifests_are_valid_kubernetes_objects(helm: Path, name: str, kube: str) -> None:
    docs = template(VALUE_SETS[name][0], kube_version=kube)
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            _check_service_monitor(doc)  # a CRD: not in the Kubernetes API schemas
            continue
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} (k8s {kube}): {exc.message}")


def _check_service_monitor(doc: Doc) -> None:
    """The fields of monitoring.coreos.com/v1 ServiceMonitor this chart uses, by hand."""
    assert doc["kind"] == "ServiceMonitor"
    assert set(doc["spec"]) <= {"selector", "namespaceSelector", "endpoints"}
    for endpoint in doc["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization"}
        for key in ("interval", "scrapeTimeout"):
            assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint[key])
        if "authorization" in endpoint:
            assert endpoint["authorization"]["type"] == "Bearer"
            assert set(endpoint["authorization"]["credentials"]) == {"name", "key"}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_bad_values_are_rejected(helm: Path, case: str) -> None:
    values, mentioned = REJECTED[case]
    result = render(values, kube_version=CURRENT_KUBE)
    assert result.returncode != 0, f"{case}: rendered anyway"
    assert mentioned in result.stderr, result.stderr


def test_probes_point_at_the_apps_routes(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    app = create_app(Settings(redis_url="redis://unused"))
    paths = app.openapi()["paths"]
    container = node_container(docs)
    expected = {
        "startupProbe": health.healthz,
        "livenessProbe": health.healthz,  # alive, no Redis check
        "readinessProbe": health.readyz,  # lease, subscriber, Redis, not draining
    }
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for kind, endpoint in expected.items():
        get = container[kind]["httpGet"]
        assert get["path"] == app.url_path_for(endpoint.__name__), kind
        assert "get" in paths[get["path"]], kind
        assert get["port"] in ports, kind
    assert ports["http"] == int(node_config(docs)["CANCEL_BUS_PORT"])  # the app listens there
    assert container["readinessProbe"]["timeoutSeconds"] > 1  # /readyz pings Redis for up to 1 s


def test_every_variable_is_a_setting_the_app_reads(
    rendered: tuple[str, list[Doc]], tmp_path: Path
) -> None:
    name, docs = rendered
    container = node_container(docs)
    names = set(node_config(docs)) | {var["name"] for var in container["env"]}
    ours = {n for n in names if n.startswith(ENV_PREFIX)}
    assert ours <= SETTINGS_ENV, f"not read by node.settings.Settings: {ours - SETTINGS_ENV}"
    assert names - ours <= {"REDIS_USERNAME", "REDIS_PASSWORD"}  # only for $(VAR) expansion
    assert "CANCEL_BUS_NODE_ID" in names and "CANCEL_BUS_REDIS_URL" in names
    # the values, resolved as the kubelet would, make a valid Settings (numbers formatted right)
    env = local_pod(docs, tmp_path).env()
    with mock.patch.dict(os.environ, env, clear=True):
        settings = Settings()
    assert settings.node_id == "cb-cancel-bus-6c9f8d7b5-x2k9p"  # the pod name
    assert settings.auth_enabled and settings.tokens()  # else it listens on 127.0.0.1 only
    assert settings.host == "0.0.0.0"
    values = merge(DEFAULTS, VALUE_SETS[name][0])
    assert settings.drain_timeout == values["config"]["drainTimeout"]
    assert settings.retention == values["config"]["retention"]
    assert settings.max_body_bytes == values["config"]["maxBodyBytes"]
    assert (settings.signing_key is not None) == values["signingKey"]["enabled"]
    expected_url = VALUE_SETS[name][1]
    if expected_url is not None:
        assert env["CANCEL_BUS_REDIS_URL"] == expected_url


def test_grace_period_covers_prestop_and_drain(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = node_container(docs)
    drain = float(node_config(docs)["CANCEL_BUS_DRAIN_TIMEOUT"])
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > drain
    # uvicorn then waits up to drain + 5 s for open connections (SSE) before it exits
    assert grace > pre_stop + drain + (drain + 5)


def test_secrets_only_through_secret_refs(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    known = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    secret_texts = [t["token"] for t in TOKENS] + [INLINE_PASSWORD]
    secret_texts += [v for d in secrets_of(docs).values() for v in d.values()]
    for doc in docs:
        if doc["kind"] == "Secret":
            continue
        text = yaml.safe_dump(doc)
        leaked = [s for s in secret_texts if s in text]
        assert not leaked, f"{doc['kind']} {doc['metadata']['name']} holds a secret"
        if doc["kind"] == "ConfigMap":
            assert not set(doc["data"]) & SECRET_ENV
    for doc in docs:
        spec = (
            doc["spec"]["template"]["spec"]
            if doc["kind"] in ("Deployment", "StatefulSet")
            else (doc["spec"] if doc["kind"] == "Pod" else None)
        )
        for container in (spec or {}).get("containers", []):
            assert all("secretRef" not in s for s in container.get("envFrom", []))
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if var["name"] in SECRET_ENV | {"OPS_TOKEN"}:
                    assert ref, f"{var['name']} must come from a secretKeyRef"
                if ref and ref["name"] in known:  # the chart's own Secret has the key
                    assert ref["key"] in secrets_of(docs)[ref["name"]], ref
                if var["name"] == "CANCEL_BUS_REDIS_URL" and "value" in var:
                    userinfo = re.match(r"[^:]+://([^@/]*)@", var["value"])
                    if userinfo and ":" in userinfo.group(1):
                        assert userinfo.group(1).endswith(":$(REDIS_PASSWORD)"), var["value"]


def test_pod_shape(rendered: tuple[str, list[Doc]]) -> None:
    name, docs = rendered
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = node_container(docs)
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert container["command"] + container["args"] == ["cancel-bus", "serve"]
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] > 0
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == tmp["name"])
    assert container["resources"]["requests"] and container["resources"]["limits"]
    labels = deployment["spec"]["selector"]["matchLabels"]
    keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert all(
        c["labelSelector"]["matchLabels"] == labels for c in spec["topologySpreadConstraints"]
    )
    assert "checksum/config" in deployment["spec"]["template"]["metadata"]["annotations"]
    assert ("replicas" in deployment["spec"]) != (name.startswith("hpa"))


def test_objects_fit_together(rendered: tuple[str, list[Doc]]) -> None:
    name, docs = rendered
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container = node_container(docs)
    service = one(docs, "Service", deployment["metadata"]["name"])

    def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
        return selector.items() <= labels.items()

    assert selects(service["spec"]["selector"], pod_labels)
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}
    assert selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels)
    for doc in docs:
        if doc["kind"] == "HorizontalPodAutoscaler":
            assert doc["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        if doc["kind"] == "ServiceMonitor":
            assert selects(doc["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
            (endpoint,) = doc["spec"]["endpoints"]
            assert endpoint["port"] == service["spec"]["ports"][0]["name"]
            app = create_app(Settings(redis_url="redis://unused"))
            assert endpoint["path"] == app.url_path_for(health.metrics.__name__)
            assert "authorization" in endpoint  # metricsRequireToken is on in that set
        if doc["kind"] == "Ingress":
            backend = doc["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
            assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    test_pod = one(docs, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {v["name"]: v.get("value") for v in test_pod["spec"]["containers"][0]["env"]}
    port = service["spec"]["ports"][0]["port"]
    assert env["SERVICE_URL"] == f"http://{service['metadata']['name']}:{port}"
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if policies:
        policy = next(
            p for p in policies if selects(p["spec"]["podSelector"]["matchLabels"], pod_labels)
        )
        http_from = policy["spec"]["ingress"][0]["from"]
        assert any(
            "podSelector" in peer
            and "namespaceSelector" not in peer
            and selects(peer["podSelector"]["matchLabels"], test_pod["metadata"]["labels"])
            for peer in http_from
        ), "the helm test pod could not reach the nodes"
        egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert egress_ports == {53, *REDIS_PORTS[name]}, "DNS and Redis only"


def test_in_chart_redis_is_marked_and_wired(helm: Path, tmp_path: Path) -> None:
    docs = template(VALUE_SETS["in-chart-redis"][0], kube_version=CURRENT_KUBE)
    redis = one(docs, "StatefulSet")
    assert redis["spec"]["replicas"] == 1
    assert "not-for-production" in json.dumps(redis["metadata"]["annotations"])
    env = local_pod(docs, tmp_path).env()
    password = secrets_of(docs)["cb-cancel-bus"]["redis-password"]
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)  # URL-safe
    assert env["CANCEL_BUS_REDIS_URL"] == f"redis://:{password}@cb-cancel-bus-redis:6379/0"
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "requirepass ${REDIS_PASSWORD}" in args and password not in args  # from stdin
    assert one(docs, "Service", "cb-cancel-bus-redis")["spec"]["clusterIP"] == "None"


def test_config_changes_roll_the_pods(helm: Path) -> None:
    def checksums(values: dict[str, Any]) -> dict[str, str]:
        docs = template(values, kube_version=CURRENT_KUBE)
        annotations: dict[str, str] = one(docs, "Deployment")["spec"]["template"]["metadata"][
            "annotations"
        ]
        return annotations

    first, again = checksums({}), checksums({})
    assert first == again  # generated secrets do not roll the pods on every render
    assert (
        checksums({"config": {"logLevel": "debug"}})["checksum/config"] != first["checksum/config"]
    )
    changed = checksums({"auth": {"tokens": TOKENS}})
    assert changed["checksum/secret-inputs"] != first["checksum/secret-inputs"]


def test_prestop_falls_back_to_exec_before_kubernetes_1_30(helm: Path) -> None:
    old = node_container(template({}, kube_version=MIN_KUBE))["lifecycle"]["preStop"]
    new = node_container(template({}, kube_version=CURRENT_KUBE))["lifecycle"]["preStop"]
    assert old == {"exec": {"command": ["sleep", "5"]}}
    assert new == {"sleep": {"seconds": 5}}


def test_every_value_is_documented_and_in_the_schema() -> None:
    text = (CHART / "values.yaml").read_text()
    documented = set(re.findall(r"^\s*## @param (\S+) \S", text, re.M))
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], prefix: str) -> None:
        for key, value in values.items():
            path = prefix + key
            assert key in node.get("properties", {}), f"{path} is not in values.schema.json"
            if path in documented:
                continue
            assert isinstance(value, dict) and value, f"{path} has no ## @param line"
            walk(value, node["properties"][key], path + ".")

    walk(DEFAULTS, schema, "")
    stale = {p for p in documented if _lookup(DEFAULTS, p) is _MISSING}
    assert not stale, f"## @param lines for values that do not exist: {stale}"


_MISSING = object()


def _lookup(values: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(values, dict) or key not in values:
            return _MISSING
        values = values[key]
    return values


def test_schema_is_as_strict_as_the_settings_model() -> None:
    """config.<camelCase> <-> Settings.<snake_case>: the chart rejects what the app would."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    for key, rule in schema["properties"].items():
        field_name = re.sub(r"([A-Z])", r"_\1", key).lower()
        assert field_name in Settings.model_fields, f"config.{key} is not a setting"
        info = Settings.model_fields[field_name]
        bounds: dict[str, Any] = {}
        for item in info.metadata:
            for attr in ("ge", "le", "max_length", "pattern"):
                if getattr(item, attr, None) is not None:
                    bounds[attr] = getattr(item, attr)
        if "ge" in bounds:
            assert rule["minimum"] >= bounds["ge"], key
        if "le" in bounds:
            assert rule["maximum"] <= bounds["le"], key
        if "max_length" in bounds:
            assert rule["maxLength"] <= bounds["max_length"], key
        if "pattern" in bounds:
            assert rule["pattern"] == bounds["pattern"], key
        if typing.get_origin(info.annotation) is typing.Literal:
            assert set(rule["enum"]) == set(typing.get_args(info.annotation)), key


def test_notes_tell_how_to_reach_cancel_and_list(helm: Path) -> None:
    def notes(values: dict[str, Any]) -> str:
        result = run_helm(
            "install", "cb", str(CHART), "--dry-run=client", "-n", "cb", values=values
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split("NOTES:", 1)[1]

    text = notes({})
    assert "port-forward svc/cb-cancel-bus" in text
    assert "/v1/runs/RUN_ID/cancel" in text and "status=active" in text
    assert "jsonpath='{.data.ops-token}'" in text
    assert "NOT FOR PRODUCTION" in notes(VALUE_SETS["in-chart-redis"][0])
    assert "issue 8" in notes(VALUE_SETS["sentinel"][0])
