"""The DCGM exporter's page as text: written by prometheus_client, read back by its parser.

A stand-in node (its state as GpuNode.state() gives it) keeps these tests to the
exposition; tests/unit/test_fakegpu_node.py renders a real simulated node.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import prometheus_client
import pytest

from gpulab.fakegpu import dcgm

BASE = 'Hostname="gpu-node-1",UUID="GPU-0",device="nvidia0",gpu="0",modelName="NVIDIA H100 80GB HBM3",' \
       'pci_bus_id="00000000:18:00.0"'


def _gpu(index: int, util: int = 0, used: int = 0, migs: list | None = None) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "bus_id": f"00000000:{0x18 + index:02X}:00.0",
            "minor_number": index, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
            "memory_reserved_mib": 0, "memory_used_mib": used, "clocks": {"sm": 1980, "memory": 2619},
            "temperature_gpu": 33, "power_draw_w": 69.5, "utilization_gpu": util, "utilization_memory": 0,
            "mig_devices": migs}


class FakeNode:
    name = "gpu-node-1"

    def __init__(self, gpus: list[dict], holders: dict | None = None, activity: float = 0.0):
        self.gpus = gpus
        self._holders = holders or {}
        self.activity = activity

    def state(self) -> dict:
        return {"gpus": self.gpus}

    def holders(self) -> dict:
        return self._holders

    def mig_activity(self, uuid: str) -> float:
        return self.activity


def test_the_page_has_dcgm_exporters_help_and_type_lines_and_series() -> None:
    node = FakeNode([_gpu(0, util=75, used=16384)], {"GPU-0": [("default", "infer", "main")]})
    lines = dcgm.render(node).splitlines()
    for name, kind, help_ in dcgm.FIELDS:
        i = lines.index(f"# HELP {name} {help_}")
        assert lines[i + 1] == f"# TYPE {name} {kind}"
        assert lines[i + 2].startswith(name + "{")
    # prometheus_client's text: label names sorted, values as Go formats floats.
    assert ('DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-1",UUID="GPU-0",container="main",device="nvidia0",gpu="0",'
            'modelName="NVIDIA H100 80GB HBM3",namespace="default",pci_bus_id="00000000:18:00.0",pod="infer"} 75.0'
            ) in lines
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{' in "\n".join(lines) and lines[-1].endswith(" 0.75")


def test_a_shared_gpu_carries_no_pod_labels() -> None:
    node = FakeNode([_gpu(0)], {"GPU-0": [("a", "p1", "c"), ("b", "p2", "c")]})
    assert f"DCGM_FI_DEV_GPU_UTIL{{{BASE}}} 0.0" in dcgm.render(node).splitlines()


def test_fields_without_series_are_left_out_help_and_type_included() -> None:
    mig = {"profile": "1g.10gb", "gi_id": 9, "uuid": "MIG-1", "memory_used_mib": 5, "memory_total_mib": 9856}
    node = FakeNode([_gpu(0, migs=[mig])], {"MIG-1": [("default", "infer", "main")]}, activity=0.25)
    text = dcgm.render(node)
    assert "DCGM_FI_DEV_GPU_UTIL" not in text and "DCGM_FI_DEV_MEM_COPY_UTIL" not in text
    samples = dcgm.parse(text)
    used = [(labels, v) for name, labels, v in samples if name == "DCGM_FI_DEV_FB_USED"]
    assert used == [({"GPU_I_ID": "9", "GPU_I_PROFILE": "1g.10gb", "Hostname": "gpu-node-1", "UUID": "GPU-0",
                      "container": "main", "device": "nvidia0", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3",
                      "namespace": "default", "pci_bus_id": "00000000:18:00.0", "pod": "infer"}, 5.0)]
    assert [v for name, _, v in samples if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == [0.25]


def test_parse_reads_back_every_series_with_its_labels() -> None:
    node = FakeNode([_gpu(0, util=40, used=100), _gpu(1)], {"GPU-1": [("ns", "pod-1", "main")]})
    samples = dcgm.parse(dcgm.render(node))
    assert len(samples) == 2 * len(dcgm.FIELDS)
    util = {labels["gpu"]: (v, labels.get("pod")) for name, labels, v in samples if name == "DCGM_FI_DEV_GPU_UTIL"}
    assert util == {"0": (40.0, None), "1": (0.0, "pod-1")}
    assert all(isinstance(v, float) for _, _, v in samples)


def test_label_values_are_escaped_and_read_back() -> None:
    gpu = _gpu(0)
    gpu["name"] = 'odd "model" \\ name'
    samples = dcgm.parse(dcgm.render(FakeNode([gpu])))
    assert {labels["modelName"] for _, labels, _ in samples} == {'odd "model" \\ name'}


def test_rendering_leaves_the_global_registry_alone() -> None:
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    node = FakeNode([_gpu(0)])
    dcgm.render(node)
    assert dcgm.registry(node) is not dcgm.registry(node)
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    assert not any(name.startswith("DCGM_") for name in before)


def test_a_page_that_is_not_prometheus_text_is_an_error() -> None:
    with pytest.raises(ValueError):
        dcgm.parse("<html>502 Bad Gateway</html>\n")


def test_the_exporter_serves_metrics_and_health() -> None:
    node = FakeNode([_gpu(0, util=10)])
    server = dcgm.serve(node, ("127.0.0.1", 0))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            first = resp.read().decode()
        assert first == dcgm.render(node)
        node.gpus[0]["utilization_gpu"] = 90  # rendered per request
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            util = [v for n, _, v in dcgm.parse(resp.read().decode()) if n == "DCGM_FI_DEV_GPU_UTIL"]
        assert util == [90.0]
        with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
            assert resp.read() == b"OK"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/nope", timeout=5)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
