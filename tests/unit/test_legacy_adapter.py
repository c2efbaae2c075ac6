"""`gpulab up` removes what the old built-in custom metrics adapter left in a cluster made before the add-on."""

from __future__ import annotations

from gpulab.cluster.embedded import LEGACY_ADAPTER_NAMESPACE, drop_legacy_adapter


class FakeClient:
    def __init__(self, objects: dict[tuple[str, str], dict]):
        self.objects = objects
        self.deleted: list[tuple[str, str]] = []

    def get(self, kind, name, namespace=None):
        return self.objects.get((kind, name))

    def delete(self, kind, name, namespace=None, **_):
        self.deleted.append((kind, name))
        return self.objects.pop((kind, name), None) is not None


def api_service(version: str, namespace: str) -> dict:
    return {"spec": {"service": {"namespace": namespace, "name": "x"}, "group": "custom.metrics.k8s.io",
                     "version": version}}


def test_the_old_adapters_api_services_and_namespace_go():
    client = FakeClient({("APIService", "v1beta1.custom.metrics.k8s.io"): api_service("v1beta1", LEGACY_ADAPTER_NAMESPACE),
                         ("APIService", "v1beta2.custom.metrics.k8s.io"): api_service("v1beta2", LEGACY_ADAPTER_NAMESPACE),
                         ("Namespace", LEGACY_ADAPTER_NAMESPACE): {"metadata": {"name": LEGACY_ADAPTER_NAMESPACE}}})
    said: list[str] = []
    drop_legacy_adapter(client, said.append)
    assert sorted(client.deleted) == [("APIService", "v1beta1.custom.metrics.k8s.io"),
                                      ("APIService", "v1beta2.custom.metrics.k8s.io"),
                                      ("Namespace", LEGACY_ADAPTER_NAMESPACE)]
    assert "gpulab addon install monitoring" in said[0]


def test_the_monitoring_add_ons_api_services_stay_and_nothing_is_said():
    client = FakeClient({("APIService", "v1beta1.custom.metrics.k8s.io"): api_service("v1beta1", "monitoring"),
                         ("APIService", "v1beta2.custom.metrics.k8s.io"): api_service("v1beta2", "monitoring")})
    said: list[str] = []
    drop_legacy_adapter(client, said.append)
    assert client.deleted == [] and said == []
