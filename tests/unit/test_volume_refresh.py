"""A running pod's ConfigMap volumes follow the ConfigMap, in place (the kubelet's sync), without a cluster."""

from __future__ import annotations

import os
from pathlib import Path

from gpulab.runtime.volumes import VolumeBuilder


class FakeClient:
    def __init__(self, configmaps: dict[str, dict[str, str]]):
        self.configmaps = configmaps

    def get(self, kind: str, name: str, namespace: str | None = None):
        assert kind == "ConfigMap"
        data = self.configmaps.get(name)
        return None if data is None else {"metadata": {"name": name, "namespace": namespace}, "data": dict(data)}


def _pod() -> dict:
    return {"metadata": {"name": "prometheus-0", "namespace": "monitoring", "uid": "u1"},
            "spec": {"nodeName": "cpu-node-1", "volumes": [
                {"name": "config", "configMap": {"name": "prometheus-config"}},
                {"name": "both", "projected": {"sources": [{"configMap": {"name": "prometheus-config"}},
                                                           {"configMap": {"name": "other"}}]}},
                {"name": "unrelated", "configMap": {"name": "other"}}]}}


def test_a_changed_configmap_reaches_the_mounted_directory_in_place(tmp_path: Path):
    client = FakeClient({"prometheus-config": {"prometheus.yml": "scrape_interval: 5s\n", "rules.yml": "a"},
                         "other": {"x": "1"}})
    builder = VolumeBuilder(client, tmp_path / "nodes")  # type: ignore[arg-type]
    pod, pod_dir = _pod(), tmp_path / "pod"
    paths = builder.prepare(pod, pod_dir)
    inode = os.stat(paths["config"]).st_ino  # what a container's bind mount holds on to
    client.configmaps["prometheus-config"] = {"prometheus.yml": "scrape_interval: 10s\n"}  # rules.yml removed
    assert builder.refresh(pod, pod_dir, "prometheus-config") == ["config", "both"]
    assert os.stat(paths["config"]).st_ino == inode
    assert (paths["config"] / "prometheus.yml").read_text() == "scrape_interval: 10s\n"
    assert not (paths["config"] / "rules.yml").exists()
    assert sorted(p.name for p in paths["both"].iterdir()) == ["prometheus.yml", "x"]
    assert (paths["unrelated"] / "x").read_text() == "1"
    assert builder.refresh(pod, pod_dir, "nothing-mounts-this") == []
