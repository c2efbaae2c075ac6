"""GPU memory of simulated GPUs: who runs out, and who goes down with them."""

from __future__ import annotations

import pytest

from gpulab.fakegpu.ledger import STEP_MIB, Demand, DemandError, DeviceUse, Ledger, demand_of, format_size

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


def oom(tried: str, capacity: str, free: str, gpu: int = 0) -> tuple[str]:
    return (f"CUDA out of memory. Tried to allocate {tried}. GPU {gpu} has a total capacity of {capacity} "
            f"of which {free} is free.",)


def free_of(line: str) -> str:
    return line.split(" of which ")[1].removesuffix(" is free.")


def test_a_program_that_fits_runs_and_holds_what_it_declared() -> None:
    ledger = Ledger()
    assert ledger.start(("a", "c"), [whole()], Demand(16 * GIB)) == {}
    assert ledger.start(("b", "c"), [whole()], Demand(H100 - 16 * GIB)) == {}  # to the last MiB
    assert ledger.owners() == [("a", "c"), ("b", "c")]
    assert ledger.pool_used("GPU-0") == ledger.gpu_memory_used("GPU-0") == H100


def test_exclusive_gpu_over_its_memory_fails_that_program_alone() -> None:
    ledger = Ledger()
    kills = ledger.start(("p1", "c"), [whole()], Demand(100 * GIB))
    assert set(kills) == {("p1", "c")}
    assert kills[("p1", "c")].exit_code == 1
    # It grew 1 GiB at a time to 79 GiB; the card's last 663 MiB cannot take the next GiB.
    assert kills[("p1", "c")].lines == oom("1.00 GiB", "79.65 GiB", "663.00 MiB")
    assert H100 - 79 * STEP_MIB == 663
    assert ("p1", "c") not in ledger


def test_lesson_04_greedy_and_its_time_sliced_neighbours_report_the_same_full_card() -> None:
    """Three 16 GiB inference replicas and a 60 GiB job time-sliced on one 80 GB card."""
    ledger = Ledger()
    infer = [(f"infer-{i}", "server") for i in (0, 2, 4)]
    for owner in infer:
        assert ledger.start(owner, [whole()], Demand(16 * GIB)) == {}
    for i in (1, 3, 5):
        assert ledger.start((f"infer-{i}", "server"), [whole("GPU-1")], Demand(16 * GIB)) == {}
    kills = ledger.start(("greedy", "train"), [whole()], Demand(60 * GIB))
    # 谁先用完谁先 OOM，另外三个一起挂: the greedy one and its three neighbours, not the other card.
    assert set(kills) == {("greedy", "train"), *infer}
    # greedy took 1 GiB at a time while it fit: 31 GiB of the 31.65 GiB the replicas left.
    held = (H100 - 3 * 16 * GIB) // STEP_MIB * STEP_MIB
    assert held == 31 * GIB
    left = H100 - 3 * 16 * GIB - held  # the card at that moment: its total minus what the four held
    assert left == 663 < STEP_MIB
    for owner in (("greedy", "train"), *infer):
        assert kills[owner].lines == oom("1.00 GiB", "79.65 GiB", "663.00 MiB"), owner
    assert {free_of(k.lines[0]) for k in kills.values()} == {format_size(left)}
    assert ledger.owners() == [("infer-1", "server"), ("infer-3", "server"), ("infer-5", "server")]
    assert ledger.pool_used("GPU-0") == 0


def test_time_sliced_programs_that_together_overflow_the_card_all_fail() -> None:
    ledger = Ledger()
    for i in range(3):
        assert ledger.start((f"p{i}", "c"), [whole()], Demand(25 * GIB)) == {}
    assert ledger.pool_used("GPU-0") == 75 * GIB
    kills = ledger.start(("p3", "c"), [whole()], Demand(25 * GIB))
    assert set(kills) == {("p0", "c"), ("p1", "c"), ("p2", "c"), ("p3", "c")}
    # 4.65 GiB were free: p3 grew to 4 GiB, then everybody's next GiB met the same 663 MiB.
    for i in range(4):
        assert kills[(f"p{i}", "c")].lines == oom("1.00 GiB", "79.65 GiB", "663.00 MiB")
    assert ledger.owners() == []
    assert ledger.pool_used("GPU-0") == 0


def test_the_last_step_may_be_smaller_than_a_gib() -> None:
    ledger = Ledger()
    ledger.start(("a", "c"), [whole()], Demand(70 * GIB))
    kills = ledger.start(("b", "c"), [whole()], Demand(9 * GIB + 900))
    # 9.65 GiB free: b takes 9 GiB, then its last 900 MiB do not fit in the 663 MiB left.
    assert kills[("b", "c")].lines == oom("900.00 MiB", "79.65 GiB", "663.00 MiB")
    assert kills[("a", "c")].lines == oom("1.00 GiB", "79.65 GiB", "663.00 MiB")


def test_a_program_bigger_than_a_time_sliced_card_still_fills_it_for_its_neighbours() -> None:
    ledger = Ledger()
    ledger.start(("a", "c"), [whole()], Demand(16 * GIB))
    kills = ledger.start(("huge", "c"), [whole()], Demand(100 * GIB))
    assert set(kills) == {("a", "c"), ("huge", "c")}
    assert {k.lines for k in kills.values()} == {oom("1.00 GiB", "79.65 GiB", "663.00 MiB")}


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
    # It filled its own 9.75 GiB instance (9 GiB, 768 MiB left), not the card.
    assert kills[("big", "c")].lines == oom("1.00 GiB", "9.75 GiB", "768.00 MiB")
    assert ledger.owners() == [("ok", "c")]


def test_time_sliced_programs_on_one_mig_instance_share_its_memory() -> None:
    ledger = Ledger()
    ledger.start(("ok", "c"), [mig(0)], Demand(8 * GIB))
    ledger.start(("a", "c"), [mig(1)], Demand(4 * GIB))
    kills = ledger.start(("b", "c"), [mig(1)], Demand(8 * GIB))
    assert set(kills) == {("a", "c"), ("b", "c")}
    assert {k.lines for k in kills.values()} == {oom("1.00 GiB", "9.75 GiB", "768.00 MiB")}
    assert ledger.owners() == [("ok", "c")]


def test_mps_clients_are_held_to_their_share() -> None:
    ledger = Ledger()
    assert ledger.start(("a", "c"), [mps()], Demand(19 * GIB)) == {}
    kills = ledger.start(("b", "c"), [mps()], Demand(21 * GIB))
    assert set(kills) == {("b", "c")}
    # Its own share stopped it at 19 GiB of 19.91 GiB; the card has 40 GiB free, a's next step fits.
    assert kills[("b", "c")].lines == oom("1.00 GiB", "19.91 GiB", "933.00 MiB")
    assert H100 // 4 - 19 * GIB == 933
    assert ledger.owners() == [("a", "c")]


def test_lesson_04_greedy_under_mps_fails_alone() -> None:
    ledger = Ledger()
    for i in range(3):
        ledger.start((f"infer-{i}", "c"), [mps()], Demand(16 * GIB))
    kills = ledger.start(("greedy", "c"), [mps()], Demand(60 * GIB))
    assert set(kills) == {("greedy", "c")}
    assert kills[("greedy", "c")].lines == oom("1.00 GiB", "19.91 GiB", "933.00 MiB")
    assert ledger.pool_used("GPU-0") == 3 * 16 * GIB


def test_a_program_on_two_gpus_dies_whole_and_frees_both() -> None:
    ledger = Ledger()
    ledger.start(("big", "c"), [whole("GPU-0", 0), whole("GPU-1", 1)], Demand(60 * GIB))
    kills = ledger.start(("late", "c"), [whole("GPU-1")], Demand(30 * GIB))
    assert set(kills) == {("big", "c"), ("late", "c")}
    # big meets the full card as its GPU 1.
    assert kills[("big", "c")].lines == oom("1.00 GiB", "79.65 GiB", "663.00 MiB", gpu=1)
    assert ledger.gpu_memory_used("GPU-0") == 0 and ledger.gpu_memory_used("GPU-1") == 0


def test_a_program_on_two_gpus_fails_on_the_fuller_one_and_spares_the_other() -> None:
    ledger = Ledger()
    ledger.start(("a", "c"), [whole("GPU-0")], Demand(40 * GIB))
    ledger.start(("b", "c"), [whole("GPU-1")], Demand(20 * GIB))
    kills = ledger.start(("both", "c"), [whole("GPU-0", 0), whole("GPU-1", 1)], Demand(50 * GIB))
    # 39 GiB on each card: GPU 0 is full, GPU 1 still has 20.65 GiB for b's next step.
    assert set(kills) == {("a", "c"), ("both", "c")}
    assert kills[("both", "c")].lines == kills[("a", "c")].lines == oom("1.00 GiB", "79.65 GiB", "663.00 MiB")
    assert ledger.owners() == [("b", "c")]


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
