"""Lab 09 graded on the real cluster: one link of the monitoring add-on's metrics pipeline broken for each run.

The grader installs the add-on when it is missing and breaks the fault
:func:`gpulab.grading.fixtures.broken_pipeline.scenario` picks for the run's
namespace (``grade-09-<learner>``) under this ``GPULAB_HOME``'s grading secret, so
the learners here are chosen under that secret to cover every fault: the
solution must find and repair each of them, and the real HPA controller must
then scale ``llm`` to 2. Then the untouched lab (zero, a message for every
check) and one typical mistake: the right diagnosis and the right edit, but
Prometheus never told to reload. Afterwards the add-on is as installed and
nothing of the grading is left; the module deletes the add-on again when it
was not there before (the next module on this cluster may expect none).
"""

from __future__ import annotations

import json
import time

import pytest

from gpulab.cluster import addons
from gpulab.grading import journal, secret
from gpulab.grading.cluster import load_lab_spec
from gpulab.grading.fixtures import broken_pipeline
from gpulab.grading.grader import namespace_for
from helpers import NEEDS_POD_NETWORK, wait_for
from lab_support import assert_no_grading_leftovers, assert_untouched_scores_zero, from_solution, grade, untouched

pytestmark = [pytest.mark.cluster, NEEDS_POD_NETWORK]

LAB09 = "09-hpa-not-scaling"
FULL = {"broken-link": 3, "evidence": 2, "config-as-installed": 2, "metric-served": 2, "scaled-up": 3,
        "scaled-as-given": 1}
RELOAD = '    core.connect_post_namespaced_service_proxy_with_path("prometheus:9090", "monitoring", "-/reload")\n'


def fault_of(learner: str, prefix: str = "grade") -> str:
    """The fault the grader makes for ``learner`` under this GPULAB_HOME's secret (made here when missing)."""
    namespace = namespace_for(load_lab_spec("09"), prefix)(LAB09, learner)
    return broken_pipeline.scenario(namespace, secret.ensure())


def learner_with(fault: str, name: str) -> str:
    """``name`` with the first number that makes the grader break ``fault`` for it."""
    return next(f"{name}{i}" for i in range(500) if fault_of(f"{name}{i}") == fault)


@pytest.fixture(scope="module")
def learners(cluster) -> dict[str, str]:
    roles = {f"solved-{fault}": learner_with(fault, "solved") for fault in broken_pipeline.FAULTS}
    roles.update(bob=learner_with("series-query", "bob"), dave=learner_with("keep-regex", "dave"))
    return roles


@pytest.fixture(scope="module")
def addon(cluster, kube):
    """The add-on as this module found it: grading installs it when missing; deleted again afterwards then."""
    was_installed = addons.installed(kube, "monitoring")
    yield
    if not was_installed:
        addons.delete(cluster.kubeconfig, "monitoring", lambda _m: None)
        wait_for(lambda: kube.get("Namespace", "monitoring") is None, 120, what="namespace monitoring deleted")


@pytest.fixture(scope="module")
def lab09(cluster, addon, learners, tmp_path_factory):
    """The solution, once per fault. The mistakes are a batch of their own: every run waits on real controllers
    (the HPA's sync, the adapter's relist), and each batch must fit one test's time."""
    subs = {learners[f"solved-{fault}"]: from_solution(LAB09) for fault in broken_pipeline.FAULTS}
    started = time.monotonic()
    batch = grade(cluster, tmp_path_factory.mktemp("lab09"), "09", subs)
    batch.seconds = (time.monotonic() - started) / len(subs)
    return batch


@pytest.fixture(scope="module")
def lab09_mistakes(cluster, addon, learners, tmp_path_factory):
    subs = {learners["bob"]: untouched(LAB09),
            # Puts the right text back into the ConfigMap, and never tells Prometheus: it reads its file only at a
            # reload.
            learners["dave"]: from_solution(LAB09, (RELOAD, ""))}
    return grade(cluster, tmp_path_factory.mktemp("lab09-mistakes"), "09", subs)


def test_the_learners_cover_every_fault(learners):
    assert {fault_of(learners[f"solved-{f}"]) for f in broken_pipeline.FAULTS} == set(broken_pipeline.FAULTS)
    # gpulab check runs in check-09-<user>: a learner's practice run rarely meets the grader's fault.
    assert [fault_of(f"x{i}") for i in range(8)] != [fault_of(f"x{i}", "check") for i in range(8)]


def test_lab09_solution_repairs_every_fault_and_the_hpa_scales(lab09, learners):
    for fault in broken_pipeline.FAULTS:
        learner = learners[f"solved-{fault}"]
        assert lab09.earned(learner) == FULL, (learner, fault, lab09.feedback(learner))
        assert lab09.rows[learner].status == "ok"
    print(f"lab 09: {lab09.seconds:.1f} s per graded submission")


def test_lab09_untouched_scores_zero(lab09_mistakes, learners):
    batch, bob = lab09_mistakes, learners["bob"]
    assert_untouched_scores_zero(batch, bob)
    assert batch.rows[bob].status == "cell-error"  # nothing repaired: the metric never comes
    assert "之一" in batch.message(bob, "broken-link")
    assert "还留着被改坏的那处" in batch.message(bob, "config-as-installed")
    assert "FailedGetPodsMetric" in batch.message(bob, "metric-served")
    assert "见 metric-served" in batch.message(bob, "scaled-up")


def test_lab09_a_config_changed_but_never_reloaded_does_not_scale(lab09_mistakes, learners):
    batch, dave = lab09_mistakes, learners["dave"]
    assert batch.earned(dave) == {**FULL, "metric-served": 0, "scaled-up": 0, "scaled-as-given": 0}
    assert "ScalingActive 是 False" in batch.message(dave, "metric-served")
    # The real controller never read a value: it decided nothing (its status says desiredReplicas 0).
    assert "读不到指标，没法按 GPU 利用率决定副本数" in batch.message(dave, "scaled-up")
    assert "有 1 个就绪副本" in batch.message(dave, "scaled-up")


def test_lab09_leaves_the_add_on_as_installed(lab09, lab09_mistakes, cluster, kube, kubectl):
    assert addons.installed(kube, "monitoring")
    for name, data in broken_pipeline.installed_configs().items():
        assert kube.get("ConfigMap", name, "monitoring")["data"] == data, name
    # What Prometheus runs, not only what its ConfigMap says: a run that put the text back without a reload
    # (dave's) is reloaded by TEARDOWN.
    proxy = "/api/v1/namespaces/monitoring/services/prometheus:9090/proxy/api/v1"
    loaded = json.loads(kubectl("get", "--raw", f"{proxy}/status/config").stdout)["data"]["yaml"]
    assert "regex: nvidia-dcgm-exporter" in loaded and "honor_labels: true" in loaded
    up = wait_for(lambda: json.loads(kubectl("get", "--raw", f"{proxy}/query?query=up%7Bjob%3D%22dcgm-exporter%22%7D")
                                     .stdout)["data"]["result"], 30, what="Prometheus scraping the DCGM exporter")
    assert all(r["value"][1] == "1" for r in up)
    assert kube.list("Role", "monitoring", label_selector="gpulab.io/grading=true") == []
    assert kube.list("RoleBinding", "monitoring", label_selector="gpulab.io/grading=true") == []
    assert journal.pending(cluster.root) == ([], [])
    assert_no_grading_leftovers(kube)
