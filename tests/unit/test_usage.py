"""Usage samples, their store and the report built from them (no cluster)."""

from __future__ import annotations

import json

import pytest

from gpulab.kube.names import ALLOCATED_DEVICES_ANNOTATION
from gpulab import usage
from gpulab.usage import plots, report, samples

H100 = "NVIDIA H100 80GB HBM3"


def _gpu(node: str, gpu: int, uuid: str, util: float, used: float, pod: tuple[str, str] | None = None,
         total: float = 81559) -> list[samples.Sample]:
    labels = {"gpu": str(gpu), "UUID": uuid, "modelName": H100, "Hostname": node}
    if pod:
        labels |= {"namespace": pod[0], "pod": pod[1], "container": "main"}
    return [("DCGM_FI_DEV_GPU_UTIL", labels, util), ("DCGM_FI_DEV_FB_USED", labels, used),
            ("DCGM_FI_DEV_FB_FREE", labels, total - used), ("DCGM_FI_DEV_GPU_TEMP", labels, 40.0)]


def _mig(node: str, uuid: str, gi: str, profile: str, active: float, pod: tuple[str, str] | None) -> list:
    labels = {"gpu": "0", "UUID": uuid, "modelName": H100, "Hostname": node, "GPU_I_PROFILE": profile,
              "GPU_I_ID": gi}
    if pod:
        labels |= {"namespace": pod[0], "pod": pod[1], "container": "main"}
    gpu_level = {"gpu": "0", "UUID": uuid, "modelName": H100, "Hostname": node}
    return [("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, active), ("DCGM_FI_DEV_FB_USED", labels, 100.0),
            ("DCGM_FI_DEV_FB_FREE", labels, 9000.0), ("DCGM_FI_DEV_GPU_TEMP", gpu_level, 33.0)]


def _pod(ns: str, name: str, devices: dict[str, list[str]], phase: str = "Running") -> dict:
    return {"metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}",
                         "annotations": {ALLOCATED_DEVICES_ANNOTATION: json.dumps({"main": devices})}},
            "status": {"phase": phase}}


def test_snapshot_names_holders_of_exclusive_time_sliced_and_mig_devices():
    page = (_gpu("n1", 0, "GPU-a", 80, 16384, ("team-a", "llm-1"))
            + _gpu("n1", 1, "GPU-b", 30, 8000)                       # time-sliced: DCGM names nobody
            + _gpu("n2", 0, "GPU-c", 0, 0)                            # free
            + _mig("n3", "GPU-d", "7", "1g.10gb", 0.5, ("team-b", "infer-1"))
            + _mig("n3", "GPU-d", "8", "3g.40gb", 0.0, None))
    pods = [_pod("dev", "nb-1", {"nvidia.com/gpu": ["GPU-b::0"]}),
            _pod("dev", "nb-2", {"nvidia.com/gpu": ["GPU-b::1"]}),
            _pod("dev", "done", {"nvidia.com/gpu": ["GPU-c"]}, phase="Succeeded")]
    snap = samples.snapshot(100.0, page, pods)
    by_key = {d.key: d for d in snap.devices}
    assert list(by_key) == ["n1/gpu0", "n1/gpu1", "n2/gpu0", "n3/gpu0/mig7-1g.10gb", "n3/gpu0/mig8-3g.40gb"]
    assert by_key["n1/gpu0"].holders == [["team-a", "llm-1"]]
    assert by_key["n1/gpu0"].fb_used_mib == 16384 and by_key["n1/gpu0"].fb_total_mib == 81559
    assert by_key["n1/gpu1"].holders == [["dev", "nb-1"], ["dev", "nb-2"]]
    assert by_key["n2/gpu0"].holders == []  # a finished pod holds nothing
    mig = by_key["n3/gpu0/mig7-1g.10gb"]
    assert mig.util == 50.0 and mig.weight == pytest.approx(1 / 7)
    assert by_key["n3/gpu0/mig8-3g.40gb"].weight == pytest.approx(3 / 7)


def test_mig_weights_come_from_the_gpus_model():
    # The same 1g profile size is 1/7 of an H100 and 1/4 of an A30: the weight is the model's, not a constant.
    a30 = [(n, {**labels, "modelName": "NVIDIA A30"}, v)
           for n, labels, v in _mig("n4", "GPU-e", "3", "1g.6gb", 0.2, ("t", "small"))
           + _mig("n4", "GPU-e", "2", "2g.12gb", 0.0, None)]
    snap = samples.snapshot(0.0, _mig("n3", "GPU-d", "7", "1g.10gb", 0.5, None) + a30, [])
    weights = {d.key: d.weight for d in snap.devices}
    assert weights == {"n3/gpu0/mig7-1g.10gb": pytest.approx(1 / 7), "n4/gpu0/mig2-2g.12gb": 0.5,
                       "n4/gpu0/mig3-1g.6gb": 0.25}
    assert samples.mig_weight("NVIDIA-A30", "1g.6gb+me") == 0.25


def test_an_unknown_gpu_model_is_an_error_not_a_guessed_weight():
    page = [(n, {**labels, "modelName": "NVIDIA Z9"}, v)
            for n, labels, v in _mig("n3", "GPU-d", "7", "1g.10gb", 0.5, None)]
    with pytest.raises(ValueError, match=r"MIG device 1g\.10gb \(GPU instance 7\) of GPU GPU-d on n3: "
                                         r"unknown GPU model 'NVIDIA Z9'; allowed: h100-80gb"):
        samples.snapshot(0.0, page, [])
    with pytest.raises(ValueError, match="has no MIG profile '1g.6gb'"):
        samples.mig_weight(H100, "1g.6gb")


def test_store_round_trips_and_skips_a_torn_line(tmp_path):
    store = samples.Store(tmp_path / "usage" / "samples.jsonl")
    for t in (10.0, 20.0, 30.0):
        store.append(samples.snapshot(t, _gpu("n1", 0, "GPU-a", 50, 1000, ("a", "p")), []))
    with open(store.path, "a") as f:
        f.write('{"t": 40, "devi')  # a writer killed mid-line
    got = store.read(since=15)
    assert [s.t for s in got] == [20.0, 30.0]
    assert got[0].devices[0].holders == [["a", "p"]]


def test_store_rotates_instead_of_growing_without_bound(tmp_path):
    store = samples.Store(tmp_path / "s.jsonl", max_bytes=600)
    for t in range(10):
        store.append(samples.snapshot(float(t), _gpu("n1", 0, "GPU-a", 50, 1000), []))
    assert store.path.stat().st_size <= 600
    assert (tmp_path / "s.jsonl.1").exists()
    times = [s.t for s in store.read()]
    assert times == sorted(times) and times[-1] == 9.0


def _series(*steps: tuple[float, list]) -> list[samples.Snapshot]:
    return [samples.snapshot(t, page, pods) for t, page, pods in
            ((t, page, []) for t, page in steps)]


def test_report_adds_up_allocated_computing_and_idle_gpu_hours():
    # 10 samples 360 s apart = 1 hour: team-a computes at 50 % on one GPU; dev holds one and computes nothing.
    snaps = _series(*[(i * 360.0, _gpu("n1", 0, "GPU-a", 50, 16384, ("team-a", "llm"))
                       + _gpu("n1", 1, "GPU-b", 0, 20480, ("dev", "notebook"))) for i in range(10)])
    quotas = [{"metadata": {"namespace": "team-a", "name": "gpu-quota"},
               "status": {"hard": {"requests.nvidia.com/gpu": "2"}, "used": {"requests.nvidia.com/gpu": "1"}}}]
    r = report.build(snaps, quotas=quotas)
    ns = {u.name: u for u in r.namespaces}
    assert ns["team-a"].allocated_h == pytest.approx(1.0)
    assert ns["team-a"].computing_h == pytest.approx(0.5)
    assert ns["team-a"].idle_h == 0 and ns["team-a"].quota == "1/2"
    assert ns["dev"].allocated_h == pytest.approx(1.0) and ns["dev"].computing_h == 0
    assert ns["dev"].idle_h == pytest.approx(1.0) and ns["dev"].idle_now == 1
    node = r.nodes[0]
    assert (node.name, node.gpus_now, node.idle_now) == ("n1", 2, 1)
    assert r.total.efficiency == pytest.approx(0.25)
    text = r.text()
    assert "team-a" in text and "1/2" in text and "1 of 2 allocated GPUs idle now" in text


def test_report_splits_a_shared_gpu_and_weights_mig_slices():
    pods = [_pod("a", "p1", {"nvidia.com/gpu": ["GPU-b::0"]}), _pod("b", "p2", {"nvidia.com/gpu": ["GPU-b::1"]})]
    snaps = [samples.snapshot(t, _gpu("n1", 1, "GPU-b", 60, 1000)
                              + _mig("n3", "GPU-d", "7", "1g.10gb", 1.0, ("c", "infer")), pods)
             for t in (0.0, 1800.0)]
    r = report.build(snaps)
    ns = {u.name: u for u in r.namespaces}
    assert ns["a"].allocated_h == pytest.approx(0.5) and ns["b"].allocated_h == pytest.approx(0.5)
    assert ns["a"].computing_h == pytest.approx(0.3)
    assert ns["c"].allocated_h == pytest.approx(1 / 7) and ns["c"].computing_h == pytest.approx(1 / 7)
    only_a = report.build(snaps, namespace="a")
    assert [u.name for u in only_a.namespaces] == ["a"]
    assert only_a.nodes[0].allocated_h == pytest.approx(0.5)


def test_report_caps_gaps_where_sampling_stopped():
    page = _gpu("n1", 0, "GPU-a", 100, 1, ("a", "p"))
    # 5 s sampling, then the cluster was down for an hour.
    snaps = _series((0.0, page), (5.0, page), (10.0, page), (3610.0, page))
    r = report.build(snaps)
    # 5 + 5 s, the gap capped at twice the sampling interval (10 s), 5 s for the last sample.
    assert r.namespaces[0].allocated_h == pytest.approx(25 / 3600)


def test_report_lists_preemptions_with_the_preemptor():
    events = [{"reason": "Preempted", "involvedObject": {"namespace": "team-b", "name": "batch-train"},
               "message": "Preempted by pod 1234-abcd on node gpu-node-1", "lastTimestamp": "2026-12-02T10:00:00Z"},
              {"reason": "Scheduled", "involvedObject": {"namespace": "x", "name": "y"}, "message": "ok"}]
    pods = [{"metadata": {"namespace": "team-a", "name": "critical-train", "uid": "1234-abcd"}}]
    r = report.build([], events=events, pods=pods)
    assert [(p.namespace, p.pod, p.node, p.by) for p in r.preemptions] == [
        ("team-b", "batch-train", "gpu-node-1", "team-a/critical-train")]
    assert "team-b/batch-train on gpu-node-1 by team-a/critical-train" in r.text()
    assert "no usage samples yet" in r.text()
    assert r.to_dict()["preemptions"][0]["by"] == "team-a/critical-train"


def test_plots_are_written_as_png(tmp_path):
    snaps = _series(*[(i * 5.0, _gpu("n1", 0, "GPU-a", 10 * i, 1000, ("a", "p") if i > 2 else None))
                      for i in range(6)])
    written = plots.save(report.build(snaps), tmp_path)
    assert [p.name for p in written] == ["utilization.png", "allocation.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("30", 30)])
def test_parse_since(text, seconds):
    assert usage.parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "-5m", "0s"])
def test_parse_since_rejects_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="--since"):
        usage.parse_since(text)
