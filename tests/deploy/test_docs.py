"""docs/deploy.md states what the tests run: the ACL rules (one namespace, several), the
namespaces' slots, the grace period the chart sets, what is rejected."""

from __future__ import annotations

import os
import re
from pathlib import Path
from unittest import mock

import yaml
from redis.cluster import key_slot

from cancel_bus import acl_rules
from cancel_bus._keys import KeySpace
from node.settings import Settings

from .helm import CHART, CURRENT_KUBE, REPO, one, template
from .test_chart import REJECTED, VALUE_SETS

DOC = (REPO / "docs" / "deploy.md").read_text()
NAMESPACE_PATTERN = r"(?<= )~cb:\{([^}]+)\}:\*(?= )"  # a namespace's key pattern in ACL rules


def test_the_documented_acl_rules_are_the_tested_ones() -> None:
    """Every `ACL SETUSER` line is the library's rule set (one namespace, every topology: no
    separate cluster line), or the form test_rendered_pods_serve_two_namespaces_on_a_redis_cluster
    runs its pods with (for a node serving several namespaces)."""
    assert acl_rules("cancel-bus") == KeySpace("cancel-bus").acl_rules()  # the merge adds nothing
    assert "+cluster|slots" in KeySpace("cancel-bus").acl_rules()  # what a Cluster client needs
    lines = re.findall(r"^ACL SETUSER .*$", DOC, re.M)
    served = [re.findall(NAMESPACE_PATTERN, line) for line in lines]
    assert sorted(map(len, served)) == [1, 3], lines  # one namespace; a node serving three
    for line, namespaces in zip(lines, served, strict=True):
        assert line == f"ACL SETUSER cancel-bus on >PASSWORD {acl_rules(*namespaces)}", line
    assert served[0] == ["cancel-bus"]


def test_the_documented_slots_are_right() -> None:
    keyslot = re.search(r'CLUSTER KEYSLOT "(cb:\{([^}]+)\}:x)"\s+# \(integer\) (\d+)', DOC)
    assert keyslot, "the CLUSTER KEYSLOT example is gone"
    key, namespace, slot = keyslot.groups()
    assert key.startswith(KeySpace(namespace).prefix)  # the real key layout
    assert key_slot(key.encode()) == key_slot(namespace.encode()) == int(slot)
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| the (\d)\w\w \|$", DOC, re.M)
    assert len(rows) == 3
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]  # three primaries, an even split
    for name, slot, shard in rows:
        assert key_slot(f"{KeySpace(name).prefix}x".encode()) == int(slot), name
        low, high = ranges[int(shard) - 1]
        assert low <= int(slot) <= high, name


def test_the_documented_default_grace_period(helm: Path) -> None:
    spec = one(template({}, kube_version=CURRENT_KUBE), "Deployment")["spec"]["template"]["spec"]
    grace = spec["terminationGracePeriodSeconds"]
    assert f"({grace} s with the defaults)" in DOC
    values = (CHART / "values.yaml").read_text()
    assert f"{grace} s with the defaults" in values
    assert yaml.safe_load(values)["terminationGracePeriodSeconds"] is None  # computed


def test_the_documented_counts_of_value_sets() -> None:
    words = {8: "eight", 9: "nine", 10: "ten"}
    assert f"`helm template` for {words.get(len(VALUE_SETS), len(VALUE_SETS))} value sets" in DOC
    assert f"and {len(REJECTED)} value sets that must be rejected" in DOC


def test_the_documented_app_namespaces_render_and_match_their_acl(helm: Path) -> None:
    """The config.appNamespaces example renders, the node reads it, and the ACL line given for
    it covers exactly the namespaces such a node serves (config.namespace and the listed ones)."""
    block = re.search(r"```yaml\n(config:\n  namespace: .*?appNamespaces:.*?)```", DOC, re.S)
    assert block, "the appNamespaces example is gone"
    values = yaml.safe_load(block.group(1))
    docs = template(values, kube_version=CURRENT_KUBE)
    with mock.patch.dict(os.environ, one(docs, "ConfigMap")["data"], clear=True):
        settings = Settings()  # as the node reads its ConfigMap
    served = {settings.namespace, *settings.app_namespaces.values()}
    assert served == {values["config"]["namespace"], *values["config"]["appNamespaces"].values()}
    lines = re.findall(r"^ACL SETUSER .*$", DOC, re.M)
    assert served in [set(re.findall(NAMESPACE_PATTERN, line)) for line in lines]
