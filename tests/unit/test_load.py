"""`gpulab load` values and the traffic model behind GPU utilisation."""

from __future__ import annotations

import pytest

from gpulab.fakegpu import load


@pytest.mark.parametrize("target, expected", [
    ("deploy/web", ("Deployment", "web")),
    ("deployment/llm-7b", ("Deployment", "llm-7b")),
    ("sts/db", ("StatefulSet", "db")),
])
def test_targets(target, expected):
    assert load.parse_target(target) == expected


@pytest.mark.parametrize("target, message", [
    ("web", "expected KIND/NAME"),
    ("deploy/", "expected KIND/NAME"),
    ("pod/web", "unknown kind 'pod'"),
    ("deploy/Web_1", "not a valid object name"),
])
def test_bad_targets(target, message):
    with pytest.raises(load.LoadError, match=message):
        load.parse_target(target)


@pytest.mark.parametrize("value, expected", [("80", 80.0), ("80%", 80.0), (" 250 ", 250.0), ("0", 0.0)])
def test_loads(value, expected):
    assert load.parse_load(value) == expected


@pytest.mark.parametrize("value, message", [
    ("eighty", "expected a number"), ("-5", "between 0 and 10000"), ("1e9", "between 0 and 10000"),
    ("nan", "between 0 and 10000"), ("", "expected a number"),
])
def test_bad_loads(value, message):
    with pytest.raises(load.LoadError, match=message):
        load.parse_load(value)


class FakeClient:
    """Recorded API objects (the model only reads)."""

    def __init__(self, objects):
        self.objects = objects

    def get(self, kind, name, ns=None):
        return self.objects.get((kind, name))


def pod(owner_rs: str):
    return {"metadata": {"name": "p", "namespace": "default",
                         "ownerReferences": [{"kind": "ReplicaSet", "name": owner_rs}]}}


def test_traffic_is_shared_by_ready_replicas():
    objs = {
        ("ReplicaSet", "web-1"): {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "web"}]}},
        ("Deployment", "web"): {"metadata": {"annotations": {load.ANNOTATION: "160"}},
                                "status": {"readyReplicas": 4}},
    }
    model = load.LoadModel(FakeClient(objs))
    assert model.utilization(pod("web-1")) == 40.0
    objs[("Deployment", "web")]["status"]["readyReplicas"] = 1
    model = load.LoadModel(FakeClient(objs))
    assert model.utilization(pod("web-1")) == 100.0


def test_no_load_means_none():
    objs = {("ReplicaSet", "web-1"): {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "web"}]}},
            ("Deployment", "web"): {"metadata": {}}}
    assert load.LoadModel(FakeClient(objs)).utilization(pod("web-1")) is None
