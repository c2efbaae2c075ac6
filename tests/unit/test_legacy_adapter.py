"""`gpulab up` removes what the old built-in custom metrics adapter left in a cluster made before the add-on."""

from __future__ import annotations

from grading_support import FakeClient

from gpulab.cluster.embedded import LEGACY_ADAPTER_NAMESPACE, drop_legacy_adapter


def api_service(version: str, namespace: str) -> dict:
    return {"kind": "APIService", "metadata": {"name": f"{version}.custom.metrics.k8s.io"},
            "spec": {"service": {"namespace": namespace, "name": "x"}, "group": "custom.metrics.k8s.io",
                     "version": version}}


def deletions(client: FakeClient) -> list[tuple[str, str]]:
    return sorted((kind, name) for op, kind, name, *_ in client.calls if op == "delete")


def test_the_old_adapters_api_services_and_namespace_go():
    client = FakeClient([api_service("v1beta1", LEGACY_ADAPTER_NAMESPACE), api_service("v1beta2", LEGACY_ADAPTER_NAMESPACE),
                         {"kind": "Namespace", "metadata": {"name": LEGACY_ADAPTER_NAMESPACE}}])
    said: list[str] = []
    drop_legacy_adapter(client, said.append)
    assert deletions(client) == [("APIService", "v1beta1.custom.metrics.k8s.io"),
                                 ("APIService", "v1beta2.custom.metrics.k8s.io"),
                                 ("Namespace", LEGACY_ADAPTER_NAMESPACE)]
    assert "gpulab addon install monitoring" in said[0]


def test_the_monitoring_add_ons_api_services_stay_and_nothing_is_said():
    client = FakeClient([api_service("v1beta1", "monitoring"), api_service("v1beta2", "monitoring")])
    said: list[str] = []
    drop_legacy_adapter(client, said.append)
    assert deletions(client) == [] and said == []
