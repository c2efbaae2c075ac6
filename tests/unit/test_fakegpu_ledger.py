"""GPU memory of simulated GPUs: who runs out, and who goes down with them."""

from __future__ import annotations

import pytest

from gpulab.fakegpu.ledger import Demand, DemandError, DeviceUse, Ledger, demand_of, format_size

H100 = 81559  # MiB
GIB = 1024


def whole(gpu: str = "GPU-0", index: int = 0) -> DeviceUse:
    """An exclusive or time-sliced device: the whole card's memory, shared with whoever else is on it."""
    return DeviceUse(pool=gpu, pool_mib=H100, limit_mib=H100, gpu_uuid=gpu, index=index)


def mig(slot: int, gpu: str = "GPU-0") -> DeviceUse:
    return DeviceUse(pool=f"MIG-{slot}", pool_mib=9984, limit_mib=9984, gpu_uuid=gpu, compute_fraction=1 / 7)


def mps(gpu: str = "GPU-0", replicas: int = 4) -> DeviceUse:
    return DeviceUse(pool=gpu, pool_mib=H100, limit_mib=H100 // replicas, gpu_uuid=gpu,
                     compute_fraction=1 / replicas)


def pod(annotations: dict[str, str]) -> dict:
    return {"metadata": {"annotations": annotations}}


# -- what a pod declares --------------------------------------------------------


def test_demand_reads_memory_and_load_with_container_overrides() -> None:
    p = pod({"gpulab.io/gpu-memory": "20Gi", "gpulab.io/gpu-utilization": "80",
             "gpulab.io/gpu-memory.sidecar": "512Mi"})
    assert demand_of(p, "train") == Demand(20 * GIB, 80)
    assert demand_of(p, "sidecar") == Demand(512, 80)


def test_a_container_declaring_nothing_is_no_cuda_program() -> None:
    assert demand_of(pod({}), "main") is None
    assert demand_of({"metadata": {}}, "main") is None


@pytest.mark.parametrize("key,value,problem", [
    ("gpulab.io/gpu-memory", "lots", "not a memory quantity"),
    ("gpulab.io/gpu-utilization", "high", "not a percentage"),
    ("gpulab.io/gpu-utilization", "150", "outside 0-100"),
])
def test_malformed_annotations_name_the_annotation(key: str, value: str, problem: str) -> None:
    with pytest.raises(DemandError, match=f"annotation {key}: .*{problem}"):
        demand_of(pod({key: value}), "main")


def test_sizes_print_as_pytorch_prints_them() -> None:
    assert format_size(0) == "0 bytes"
    assert format_size(512) == "512.00 MiB"
    assert format_size(H100) == "79.65 GiB"


# -- who runs out ------------------------------------------------------------------


def test_exclusive_gpu_over_its_memory_fails_that_program_alone() -> None:
    ledger = Ledger()
    kills = ledger.start(("p1", "c"), [whole()], Demand(100 * GIB))
    assert set(kills) == {("p1", "c")}
    assert kills[("p1", "c")].exit_code == 1
    assert kills[("p1", "c")].lines == (
        "CUDA out of memory. Tried to allocate 100.00 GiB. GPU 0 has a total capacity of 79.65 GiB "
        "of which 79.65 GiB is free.",)
    assert ("p1", "c") not in ledger


def test_time_sliced_programs_that_together_overflow_the_card_all_fail() -> None:
    ledger = Ledger()
    for i in range(3):
        assert ledger.start((f"p{i}", "c"), [whole()], Demand(25 * GIB)) == {}
    assert ledger.pool_used("GPU-0") == 75 * GIB
    kills = ledger.start(("p3", "c"), [whole()], Demand(25 * GIB))
    # 谁先用完谁先 OOM，另外三个一起挂: the newcomer and its three neighbours.
    assert set(kills) == {("p0", "c"), ("p1", "c"), ("p2", "c"), ("p3", "c")}
    assert "Tried to allocate 25.00 GiB" in kills[("p3", "c")].lines[0]
    assert "of which 4.65 GiB is free" in kills[("p3", "c")].lines[0]
    for i in range(3):
        assert "CUDA out of memory" in kills[(f"p{i}", "c")].lines[0]
        assert "of which 0 bytes is free" in kills[(f"p{i}", "c")].lines[0]
    assert ledger.owners() == []
    assert ledger.pool_used("GPU-0") == 0


def test_programs_on_another_card_are_not_affected() -> None:
    ledger = Ledger()
    ledger.start(("a", "c"), [whole("GPU-0")], Demand(50 * GIB))
    ledger.start(("b", "c"), [whole("GPU-1")], Demand(50 * GIB))
    kills = ledger.start(("c", "c"), [whole("GPU-0")], Demand(50 * GIB))
    assert set(kills) == {("a", "c"), ("c", "c")}
    assert ledger.owners() == [("b", "c")]


def test_a_mig_instance_isolates_memory_from_its_neighbours() -> None:
    ledger = Ledger()
    assert ledger.start(("ok", "c"), [mig(0)], Demand(8 * GIB)) == {}
    kills = ledger.start(("big", "c"), [mig(1)], Demand(12 * GIB))
    assert set(kills) == {("big", "c")}
    assert "GPU 0 has a total capacity of 9.75 GiB" in kills[("big", "c")].lines[0]
    assert ledger.owners() == [("ok", "c")]


def test_mps_clients_are_held_to_their_share() -> None:
    ledger = Ledger()
    assert ledger.start(("a", "c"), [mps()], Demand(19 * GIB)) == {}
    kills = ledger.start(("b", "c"), [mps()], Demand(21 * GIB))
    assert set(kills) == {("b", "c")}
    assert "total capacity of 19.91 GiB" in kills[("b", "c")].lines[0]
    assert ledger.owners() == [("a", "c")]


def test_a_program_on_two_gpus_dies_whole_and_frees_both() -> None:
    ledger = Ledger()
    ledger.start(("big", "c"), [whole("GPU-0", 0), whole("GPU-1", 1)], Demand(60 * GIB))
    kills = ledger.start(("late", "c"), [whole("GPU-1")], Demand(30 * GIB))
    assert set(kills) == {("big", "c"), ("late", "c")}
    assert ledger.gpu_memory_used("GPU-0") == 0 and ledger.gpu_memory_used("GPU-1") == 0


def test_stopping_frees_memory() -> None:
    ledger = Ledger()
    ledger.start(("a", "c"), [whole()], Demand(70 * GIB))
    assert ledger.stop(("a", "c")) is True
    assert ledger.stop(("a", "c")) is False
    assert ledger.start(("b", "c"), [whole()], Demand(70 * GIB)) == {}


# -- what nvidia-smi and DCGM read -------------------------------------------------


def test_load_adds_up_per_card_and_mig_slices_count_by_size() -> None:
    ledger = Ledger()
    ledger.start(("a", "c"), [whole()], Demand(1024, 70))
    ledger.start(("b", "c"), [whole()], Demand(1024, 50))
    assert ledger.gpu_utilization("GPU-0") == 100  # what nvidia-smi prints
    assert ledger.gpu_demand("GPU-0") == 120       # what the two time-sliced programs want
    assert ledger.gpu_demand("GPU-0", without=("a", "c")) == 50  # what a's neighbours want
    ledger.start(("m", "c"), [mig(0, "GPU-1")], Demand(1024, 70))
    assert ledger.gpu_utilization("GPU-1") == 10
    assert ledger.pool_utilization("MIG-0") == 70


def test_processes_list_each_program_with_its_memory() -> None:
    ledger = Ledger()
    ledger.start(("a", "train"), [whole()], Demand(2048), process="torchrun")
    [(owner, use, demand, name)] = ledger.processes("GPU-0")
    assert owner == ("a", "train") and use.pool == "GPU-0" and demand.memory_mib == 2048 and name == "torchrun"
    assert ledger.processes("GPU-1") == []


def test_set_utilization_changes_only_a_running_program():
    from gpulab.fakegpu.ledger import Demand, DeviceUse, Ledger

    ledger = Ledger()
    use = DeviceUse("GPU-a", 81559, 81559, "GPU-a")
    ledger.start(("u1", "main"), [use], Demand(1024, 0))
    assert ledger.set_utilization(("u1", "main"), 55) is True
    assert ledger.gpu_utilization("GPU-a") == 55
    assert ledger.set_utilization(("u1", "main"), 55) is False
    assert ledger.set_utilization(("u1", "main"), 250) is True and ledger.gpu_utilization("GPU-a") == 100
    assert ledger.set_utilization(("nobody", "main"), 10) is False
    assert ledger.pool_used("GPU-a") == 1024  # memory is untouched
