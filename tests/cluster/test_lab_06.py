"""Lab 06 (the chapter's exercise 3: sizing and deploying a 7B inference service) graded on the real cluster.

The model's 90 s load is the notebook's ``model_load_seconds`` parameter, which
the grader sets to 0 s (``PARAMETERS`` of lab_06): the probe is judged against
90 s from the spec, the fast run shows the replicas get their share and pass
their probes.
"""

from __future__ import annotations

import time

import pytest

from lab_support import (assert_no_grading_leftovers, assert_untouched_scores_zero, from_solution, gpu_stack_state,
                         grade, untouched)

pytestmark = pytest.mark.cluster

LAB = "06-inference-sizing"
HPA_METRIC = ('    - type: Pods\n      pods:\n        metric:\n          name: DCGM_FI_DEV_GPU_UTIL\n'
              '        target:\n          type: AverageValue\n          averageValue: "70"')


@pytest.fixture(scope="module")
def before(kube):
    return gpu_stack_state(kube)


def submissions() -> dict:
    return {
        "alice": from_solution(LAB),
        "bob": untouched(LAB),
        # The kubelet's default-sized budget (5 s x 6 = 30 s) for a 90 s load, and an HPA on CPU.
        "carol": from_solution(
            LAB, ('"periodSeconds": 5, "failureThreshold": 24}', '"periodSeconds": 5, "failureThreshold": 6}'),
            (HPA_METRIC, '    - type: Resource\n      resource:\n        name: cpu\n        target:\n'
                         '          type: Utilization\n          averageUtilization: 70')),
        # Whole cards: no MIG, one card per replica, and an HPA allowed to grow past the two cards.
        "dave": from_solution(
            LAB, ('sharing_scheme = "mig"', 'sharing_scheme = "whole-gpu"'),
            ('kubectl(["patch", "clusterpolicies.nvidia.com/cluster-policy", "--type", "merge", "-p",\n'
             '         \'{"spec": {"mig": {"strategy": "mixed"}}}\'])\n'
             'kubectl(f"label node {gpu_node} nvidia.com/mig.config=all-3g.40gb --overwrite")\n', ""),
            ('gpu_resource = "nvidia.com/mig-3g.40gb"', 'gpu_resource = "nvidia.com/gpu"'),
            ("  minReplicas: 2\n  maxReplicas: 4", "  minReplicas: 1\n  maxReplicas: 4"),
            ("replicas = 2\n", "replicas = 1\n")),
    }


@pytest.fixture(scope="module")
def lab06(cluster, kube, before, tmp_path_factory):
    subs = submissions()
    started = time.monotonic()
    batch = grade(cluster, tmp_path_factory.mktemp("lab06"), "06", subs)
    print(f"lab 06: {len(subs)} submissions graded in {time.monotonic() - started:.1f} s")
    return batch


def test_lab06_scores(lab06):
    assert lab06.earned("alice") == {"scheme": 2, "fits-memory": 2, "replicas": 2, "startup-probe": 3, "ready": 2,
                                     "hpa-metric": 3, "hpa-range": 2, "budget-recorded": 1, "probes-kept": 1}
    assert lab06.rows["alice"].total == 18 and lab06.rows["alice"].status == "ok"
    assert_untouched_scores_zero(lab06)

    # The too-short probe still becomes Ready in the fast run (0 s load): it is judged against 90 s.
    assert lab06.earned("carol") == {"scheme": 2, "fits-memory": 2, "replicas": 2, "startup-probe": 0, "ready": 2,
                                     "hpa-metric": 1, "hpa-range": 2, "budget-recorded": 1, "probes-kept": 1}
    assert "最多只给 30 秒" in lab06.message("carol", "startup-probe")
    assert "type: Resource 只看 CPU 和内存" in lab06.message("carol", "hpa-metric")

    assert lab06.earned("dave") == {"scheme": 1, "fits-memory": 2, "replicas": 1, "startup-probe": 3, "ready": 2,
                                    "hpa-metric": 3, "hpa-range": 1, "budget-recorded": 1, "probes-kept": 1}
    assert "整卡独占能跑" in lab06.message("dave", "scheme")
    assert "只有一个副本" in lab06.message("dave", "replicas")
    assert "超过了两张卡上放得下的副本数" in lab06.message("dave", "hpa-range")
    for learner in ("carol", "dave"):
        for o in lab06.rows[learner].outcomes:
            assert "3g.40gb" not in o.message and "DCGM_FI_DEV_GPU_UTIL" not in o.message


def test_lab06_leaves_the_gpu_stack_as_it_found_it(lab06, kube, before):
    assert gpu_stack_state(kube) == before
    assert_no_grading_leftovers(kube)
