"""`gpulab load svc/NAME RPS`: its input, the request generator it runs, and how it starts, changes and stops."""

from __future__ import annotations

import pytest

from gpulab.fakegpu import load


@pytest.mark.parametrize("target, expected", [("svc/llm", "llm"), ("service/llm-7b", "llm-7b"),
                                              ("services/web", "web")])
def test_targets(target, expected):
    assert load.parse_target(target) == expected


@pytest.mark.parametrize("target, message", [
    ("llm", "expected svc/NAME"),
    ("svc/", "expected svc/NAME"),
    ("deploy/llm", "traffic goes to a Service, not a 'deploy'"),
    ("svc/Web_1", "not a valid Service name"),
    ("svc/1web", "not a valid Service name"),
])
def test_bad_targets(target, message):
    with pytest.raises(load.LoadError, match=message):
        load.parse_target(target)


@pytest.mark.parametrize("value, expected", [("5", 5.0), (" 0.5 ", 0.5), ("0", 0.0), ("1000", 1000.0)])
def test_rates(value, expected):
    assert load.parse_rps(value) == expected


@pytest.mark.parametrize("value, message", [
    ("five", "expected requests per second"), ("-5", "between 0 and 1000"), ("1e9", "between 0 and 1000"),
    ("nan", "between 0 and 1000"), ("", "expected requests per second"), ("80%", "expected requests per second"),
])
def test_bad_rates(value, message):
    with pytest.raises(load.LoadError, match=message):
        load.parse_rps(value)


def service(name="llm", ns="lesson-07", ports=None, cluster_ip="10.96.0.20"):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": cluster_ip, "ports": ports if ports is not None else [{"name": "http", "port": 80}]}}


def test_the_generator_calls_the_service_by_its_dns_name_at_the_rate():
    d = load.generator(service(), 2.5, max_tokens=8)
    assert d["metadata"] == {"name": "load-llm", "namespace": "lesson-07",
                             "labels": {"app.kubernetes.io/name": "gpulab-load", "gpulab.io/load-target": "llm"}}
    assert d["spec"]["strategy"] == {"type": "Recreate"}  # the old rate stops before the new one starts
    [c] = d["spec"]["template"]["spec"]["containers"]
    assert c["image"].startswith("gpulab/llm-server:")
    assert c["args"] == ["loadgen", "http://llm.lesson-07.svc:80/v1/completions", "--rps", "2.5",
                         "--duration", "0", "--max-tokens", "8"]


def test_a_port_is_picked_by_name_or_number_and_a_missing_one_is_named():
    svc = service(ports=[{"name": "metrics", "port": 9400}, {"name": "http", "port": 8000}])
    assert load.service_url(svc).endswith(":9400/v1/completions")
    assert load.service_url(svc, "http").endswith(":8000/v1/completions")
    assert load.service_url(svc, "8000").endswith(":8000/v1/completions")
    with pytest.raises(load.LoadError, match=r"has no port 'grpc'; its ports: metrics:9400, http:8000"):
        load.service_url(svc, "grpc")


def test_a_headless_or_portless_service_cannot_take_load():
    with pytest.raises(load.LoadError, match="headless"):
        load.service_url(service(cluster_ip="None"))
    with pytest.raises(load.LoadError, match="has no ports"):
        load.service_url(service(ports=[]))


class FakeClient:
    """Objects by (kind, name); records what was applied and deleted."""

    def __init__(self, *objects):
        self.objects = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        self.calls = []

    def get(self, kind, name, ns=None):
        return self.objects.get((kind, name))

    def apply(self, obj):
        self.calls.append(("apply", obj["metadata"]["name"], obj["spec"]["template"]["spec"]["containers"][0]["args"]))
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj
        return obj

    def delete(self, kind, name, ns=None):
        self.calls.append(("delete", name))
        del self.objects[(kind, name)]


def test_set_load_starts_changes_and_stops_the_generator():
    client = FakeClient(service())
    said = load.set_load(client, "svc/llm", "5", "lesson-07")
    assert said.startswith("deployment.apps/load-llm created: 5 requests/s of 16 tokens to "
                           "http://llm.lesson-07.svc:80/v1/completions")
    assert load.set_load(client, "svc/llm", "2", "lesson-07", max_tokens=8).startswith(
        "deployment.apps/load-llm configured: 2 requests/s of 8 tokens")
    assert [c[2][3] for c in client.calls] == ["5", "2"]
    assert load.set_load(client, "svc/llm", "0", "lesson-07") == \
        "deployment.apps/load-llm deleted: no more traffic to service/llm"
    assert load.set_load(client, "svc/llm", "0", "lesson-07") == "no traffic to service/llm: nothing to stop"


def test_set_load_on_a_missing_service_says_where_to_look_and_changes_nothing():
    client = FakeClient()
    with pytest.raises(load.LoadError, match=r"Service lesson-07/llm not found \(kubectl -n lesson-07 get services\)"):
        load.set_load(client, "svc/llm", "5", "lesson-07")
    with pytest.raises(load.LoadError, match="--max-tokens 0: must be between 1 and 4096"):
        load.set_load(FakeClient(service()), "svc/llm", "5", "lesson-07", max_tokens=0)
    assert client.calls == []
