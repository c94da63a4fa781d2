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
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import pytest
import uvicorn
import yaml

from cancel_bus._redis import connect
from node import cli, health, server
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
SECRET_ENV = {
    "CANCEL_BUS_API_TOKENS",
    "CANCEL_BUS_SIGNING_KEY",
    "CANCEL_BUS_REDIS_PASSWORD",
    "CANCEL_BUS_REDIS_SENTINEL_PASSWORD",
}
TOKENS = [
    {"token": "ops-token-4f1c9a7e2b6d0835", "role": "ops", "name": "on-call"},
    {"token": "alice-token-9d2e7b4a1c6f3058", "role": "user", "userId": "alice"},
]
# Passwords need not be URL-safe any more: the node URL-encodes them itself.
INLINE_PASSWORD = "inline/redis:p@ss#7c3e91?%+ &"
PASSWORD = "P@ss/w:rd?#%+ 1"  # in the user's own Secret
USER = "cancel-bus@checkout"
SENTINEL_PASSWORD = "sentinel/:@?#%+& 0f6c2b9a"  # the node URL-encodes it too
SENTINEL_USER = "sentinel&user"
SENTINELS = ["sentinel-0.sentinel:26379", "sentinel-1.sentinel:26379", "sentinel-2.sentinel:26379"]
SHARDS = ["redis-0.redis:6379", "redis-1.redis:6379", "redis-2.redis:6379"]
CA_QUERY = "ssl_ca_certs=/etc/cancel-bus/redis-tls/ca.crt"


def _with_credentials(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{rest}"


EXTERNAL_URL = (
    f"rediss://redis.prod.internal:6380/2?{CA_QUERY}&ssl_certfile=/etc/cancel-bus/redis-tls/"
    "tls.crt&ssl_keyfile=/etc/cancel-bus/redis-tls/tls.key&ssl_cert_reqs=required"
)
SENTINEL_URL = (
    "rediss+sentinel://" + ",".join(SENTINELS) + f"/mymaster/1?{CA_QUERY}&ssl_cert_reqs=required"
    "&ssl_check_hostname=false"
)
SENTINEL_CREDENTIALS = urlencode(
    {"sentinel_username": SENTINEL_USER, "sentinel_password": SENTINEL_PASSWORD}
)
CLUSTER_URL = "rediss+cluster://" + ",".join(SHARDS) + "?ssl_cert_reqs=required"
APP_NAMESPACES = {"support": "support-agents", "search": "search-agents"}


# name -> (values, the CANCEL_BUS_REDIS_URL they render, kubelet-expanded, and the URL the node
# connects with: settings.redis_connection_url(), credentials URL-encoded by the node)
VALUE_SETS: dict[str, tuple[dict[str, Any], str | None, str | None]] = {
    "defaults": ({}, "redis://redis:6379/0", "redis://redis:6379/0"),
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
        EXTERNAL_URL,
        _with_credentials(EXTERNAL_URL, USER, PASSWORD),
    ),
    "sentinel": (
        {
            "redis": {
                "mode": "sentinel",
                "sentinel": {
                    "masterName": "mymaster",
                    "addresses": SENTINELS,
                    "db": 1,
                    "auth": {"username": SENTINEL_USER, "existingSecret": "sentinel-credentials"},
                },
                "auth": {"username": "cancel-bus", "existingSecret": "redis-credentials"},
                # typed as redis-py types it, for the sentinels as for Redis
                "tls": {"enabled": True, "existingSecret": "redis-tls", "checkHostname": False},
            }
        },
        SENTINEL_URL,
        _with_credentials(SENTINEL_URL, "cancel-bus", PASSWORD) + "&" + SENTINEL_CREDENTIALS,
    ),
    "cluster": (
        {
            "redis": {
                "mode": "cluster",
                "cluster": {"addresses": SHARDS},
                "tls": {"enabled": True, "checkHostname": False},  # the system CAs
            },
            "config": {"appNamespaces": APP_NAMESPACES},  # one node, three namespaces
        },
        CLUSTER_URL + "&ssl_check_hostname=false",
        CLUSTER_URL + "&ssl_check_hostname=false",
    ),
    "auth-on": (
        {
            "auth": {"tokens": TOKENS, "generateOpsToken": False},
            "redis": {"url": "redis://redis.data:6379/0", "auth": {"password": INLINE_PASSWORD}},
            "config": {
                "retention": 1_000_000,
                "maxBodyBytes": 1_048_576,
                "drainTimeout": 30.5,
                "profileCheckpoints": True,
                "accessLog": False,
            },
        },
        "redis://redis.data:6379/0",
        f"redis://:{quote(INLINE_PASSWORD, safe='')}@redis.data:6379/0",
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
        "redis://redis.data:6380/0",
    ),
    "in-chart-redis": (
        {
            "redis": {"inChart": {"enabled": True, "persistence": {"enabled": True}}},
            "networkPolicy": {"enabled": True},
        },
        "redis://cb-cancel-bus-redis:6379/0",
        None,  # the generated password: checked by its own test
    ),
    "url-from-secret": (
        {
            "redis": {
                "urlFromSecret": {"name": "redis-url", "key": "url"},
                "auth": {"existingSecret": "redis-credentials", "passwordKey": "password"},
                "tls": {"enabled": True, "existingSecret": "redis-tls"},
            },
            "preStopSleepSeconds": 0,
            "terminationGracePeriodSeconds": 120,
        },
        "rediss://from-the-secret:6380/0",
        f"rediss://:{quote(PASSWORD, safe='')}@from-the-secret:6380/0",
    ),
}
REDIS_PORTS = {"hpa-servicemonitor-networkpolicy-ingress": {6380}, "in-chart-redis": {6379}}
# Secrets the value sets name but do not create (the user's own), with test contents.
EXISTING_SECRETS = {
    "redis-credentials": {"username": USER, "password": PASSWORD, "redis-password": PASSWORD},
    "sentinel-credentials": {"sentinel-password": SENTINEL_PASSWORD},
    "redis-tls": {"ca.crt": "CA", "tls.crt": "CERT", "tls.key": "KEY"},
    "cancel-bus-tokens": {"api-tokens": json.dumps({t["token"]: {"role": "ops"} for t in TOKENS})},
    "cancel-bus-signing": {"signing-key": "a-signing-key-from-an-existing-secret"},
    "redis-url": {"url": "rediss://from-the-secret:6380/0"},
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
        {"terminationGracePeriodSeconds": 20},
        "terminationGracePeriodSeconds",
    ),
    "sentinel user without a sentinel password": (
        {
            "redis": {
                "mode": "sentinel",
                "sentinel": {"addresses": SENTINELS, "auth": {"username": "sentinel"}},
            }
        },
        "existingSecret",
    ),
    "app namespace that is not an id": (
        {"config": {"appNamespaces": {"support": "support agents"}}},
        "appNamespaces",
    ),
    "app name that is not an id": (
        {"config": {"appNamespaces": {"sup:port": "support-agents"}}},
        "'sup:port'",
    ),
    "app namespaces as a JSON string": (
        {"config": {"appNamespaces": json.dumps(APP_NAMESPACES)}},
        "appNamespaces",
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
    assert names == ours, f"not a setting: {names - ours}"
    assert {"CANCEL_BUS_NODE_ID", "CANCEL_BUS_REDIS_URL", "CANCEL_BUS_APP_NAMESPACES"} <= names
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
    assert settings.profile_checkpoints == values["config"]["profileCheckpoints"]
    assert settings.access_log == values["config"]["accessLog"]
    assert (settings.signing_key is not None) == values["signingKey"]["enabled"]
    assert settings.namespace == values["config"]["namespace"]
    assert settings.app_namespaces == values["config"]["appNamespaces"]
    _, expected_url, expected_connection = VALUE_SETS[name]
    assert env["CANCEL_BUS_REDIS_URL"] == expected_url
    assert "@" not in urlsplit(expected_url or "").netloc  # credentials come separately
    assert "sentinel_" not in (expected_url or "")  # and the sentinels' too
    for secret in (PASSWORD, INLINE_PASSWORD, SENTINEL_PASSWORD):
        assert secret not in env["CANCEL_BUS_REDIS_URL"]
        assert quote(secret, safe="") not in env["CANCEL_BUS_REDIS_URL"]
    if expected_connection is None:
        return
    connection = settings.redis_connection_url()
    assert connection is not None and url_parts(connection) == url_parts(expected_connection)
    # the app's own URL parser takes it, and hands each part to the right connection
    client: Any = connect(connection, client_name="chart-test").client
    pools = client.nodes_manager if name == "cluster" else client.connection_pool
    kwargs = pools.connection_kwargs
    auth = values["redis"]["auth"]
    if auth["existingSecret"] or auth["password"]:
        assert kwargs["password"] in (PASSWORD, INLINE_PASSWORD)  # decoded as it was
    if name == "sentinel":
        assert kwargs["username"] == "cancel-bus" and kwargs["db"] == 1
        assert kwargs["ssl_ca_certs"] == "/etc/cancel-bus/redis-tls/ca.crt"
        assert kwargs["ssl_check_hostname"] is False  # a bool, not the text "false"
        for sentinel in client.connection_pool.sentinel_manager.sentinels:
            sentinel_kwargs = sentinel.connection_pool.connection_kwargs
            assert sentinel_kwargs["username"] == SENTINEL_USER
            assert sentinel_kwargs["password"] == SENTINEL_PASSWORD  # decoded as it was
            # the TLS options reach the sentinel connections too
            assert sentinel.connection_pool.connection_class.__name__ == "SSLConnection"
            for option in ("ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname"):
                assert sentinel_kwargs[option] == kwargs[option], option
    if name == "cluster":
        assert kwargs["connection_class"].__name__ == "SSLConnection"
        assert kwargs["ssl_check_hostname"] is False


def url_parts(url: str) -> tuple[Any, ...]:
    """What a URL says once parsed: scheme, user and password decoded, hosts, path, query pairs
    decoded (in any order). A value that was not encoded right parses differently."""
    parts = urlsplit(url)
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    hosts = parts.netloc.rpartition("@")[2]
    return parts.scheme, user, password, hosts, parts.path, sorted(parse_qsl(parts.query))


def uvicorn_shutdown_seconds() -> float:
    """The graceful-shutdown timeout ``cancel-bus serve`` gives uvicorn (after the drain), read
    from the config it builds (the server is not run)."""
    seen: list[Any] = []
    real = uvicorn.Config

    def config(*args: Any, **kwargs: Any) -> Any:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    env = {"CANCEL_BUS_REDIS_URL": "redis://unused:6379/0"}
    with (
        mock.patch.dict(os.environ, env, clear=True),
        mock.patch.object(uvicorn, "Config", config),
        mock.patch.object(server.DrainingServer, "run"),
    ):
        assert cli.main(["serve"]) == 0
    (used,) = seen
    assert used.timeout_graceful_shutdown is not None
    return float(used.timeout_graceful_shutdown)


MIN_MARGIN = 5  # cancelling and recording the runs left after the drain timeout, leaving


def test_grace_period_covers_prestop_drain_and_shutdown(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = node_container(docs)
    drain = float(node_config(docs)["CANCEL_BUS_DRAIN_TIMEOUT"])
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec["terminationGracePeriodSeconds"]
    # SIGTERM after the preStop; the drain (it ends the follow streams at once); then uvicorn
    # gives the connections still open a fixed time; then a margin
    assert grace >= pre_stop + drain + uvicorn_shutdown_seconds() + MIN_MARGIN


def test_grace_period_check_follows_the_app(helm: Path) -> None:
    """Defaults: preStop 5 + drain 20 + uvicorn's shutdown + margin; the template refuses one
    second less than the minimum, and no longer asks for twice the drain."""
    budget = 5 + 20 + uvicorn_shutdown_seconds()
    minimum = int(budget) + MIN_MARGIN
    spec = one(template({}, kube_version=CURRENT_KUBE), "Deployment")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == int(budget) + 10  # the default margin
    values = {"terminationGracePeriodSeconds": minimum}
    assert render(values, kube_version=CURRENT_KUBE).returncode == 0
    short = render({"terminationGracePeriodSeconds": minimum - 1}, kube_version=CURRENT_KUBE)
    assert short.returncode != 0 and f"= {minimum}," in short.stderr, short.stderr
    assert minimum < 5 + 20 + 20  # the old rule (preStop + drain + drain + 5) is gone


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
                    url = var["value"]
                    assert "@" not in urlsplit(url).netloc, url  # no credentials in the URL
                    # nor the sentinels': they have settings of their own now
                    assert "$(" not in url and "sentinel_" not in url, url


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
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)  # safe in the server's config file
    assert env["CANCEL_BUS_REDIS_URL"] == "redis://cb-cancel-bus-redis:6379/0"
    assert env["CANCEL_BUS_REDIS_PASSWORD"] == password
    assert "CANCEL_BUS_REDIS_USERNAME" not in env  # the default user
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
        _check_bounds(rule, info.metadata, key)
        if typing.get_origin(info.annotation) is typing.Literal:
            assert set(rule["enum"]) == set(typing.get_args(info.annotation)), key
        if typing.get_origin(info.annotation) is dict:  # config.appNamespaces: id -> id
            key_type, value_type = typing.get_args(info.annotation)
            assert rule["type"] == "object", key
            for part, annotated in (
                (rule["propertyNames"], key_type),
                (rule["additionalProperties"], value_type),
            ):
                constraints = typing.get_args(annotated)[1:]
                assert constraints, f"{key}: the setting's ids are not constrained"
                assert part["type"] == "string" and part["minLength"] >= 1, key
                _check_bounds(part, constraints, key)


def _check_bounds(rule: dict[str, Any], metadata: Any, key: str) -> None:
    bounds: dict[str, Any] = {}
    for item in metadata:
        for attr in ("ge", "gt", "le", "max_length", "pattern"):
            if getattr(item, attr, None) is not None:
                bounds[attr] = getattr(item, attr)
    if "ge" in bounds:
        assert rule["minimum"] >= bounds["ge"], key
    if "gt" in bounds:
        inf = float("inf")
        exclusive, inclusive = rule.get("exclusiveMinimum", -inf), rule.get("minimum", -inf)
        assert exclusive >= bounds["gt"] or inclusive > bounds["gt"], key
    if "le" in bounds:
        assert rule["maximum"] <= bounds["le"], key
    if "max_length" in bounds:
        assert rule["maxLength"] <= bounds["max_length"], key
    if "pattern" in bounds:
        assert rule["pattern"] == bounds["pattern"], key


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
    sentinel = notes(VALUE_SETS["sentinel"][0])  # TLS reaches the sentinels: no caveat left
    assert "WARNING" not in sentinel and "checkHostname" not in sentinel
    cluster = notes(VALUE_SETS["cluster"][0])
    assert "WARNING" not in cluster
    for app, namespace in APP_NAMESPACES.items():
        assert f'{app} -> "{namespace}"' in cluster
