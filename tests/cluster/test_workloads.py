"""Pods on simulated nodes behave as on a real cluster: commands, logs, Jobs, probes, volumes."""

from __future__ import annotations

import os

import pytest

from gpulab.runtime import sandbox
from helpers import create, wait_for

pytestmark = pytest.mark.cluster


def job(name: str, command: list[str], backoff: int = 2, **pod_spec) -> dict:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": backoff, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "ubuntu:24.04", "command": command}],
            **pod_spec}}},
    }


def job_condition(kube, ns, name):
    j = kube.get("Job", name, ns) or {}
    for c in j.get("status", {}).get("conditions") or []:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c
    return None


def pod_of(kube, ns, selector):
    pods = kube.list("Pod", ns, label_selector=selector)
    return pods[0] if pods else None


def test_job_output_is_in_kubectl_logs(kube, ns, kubectl):
    create(kube, ns, job("hello", ["bash", "-c", "echo 'train step done'; echo to-stderr >&2"]))
    cond = wait_for(lambda: job_condition(kube, ns, "hello"), 60, what="Job finished")
    assert cond["type"] == "Complete"
    out = kubectl("-n", ns, "logs", "job/hello").stdout
    assert "train step done" in out
    assert "to-stderr" in out


def test_failing_job_gives_up_after_backoff_limit(kube, ns):
    create(kube, ns, job("fails", ["sh", "-c", "echo failing; exit 1"], backoff=2))
    cond = wait_for(lambda: job_condition(kube, ns, "fails"), 120, what="Job Failed")
    assert cond["type"] == "Failed"
    assert cond["reason"] == "BackoffLimitExceeded"
    pods = kube.list("Pod", ns, label_selector="job-name=fails")
    assert len(pods) == 3
    for p in pods:
        assert p["status"]["phase"] == "Failed"
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 1 and term["reason"] == "Error"


def test_an_evicted_pod_ends_failed_so_a_pod_failure_policy_can_ignore_the_disruption(kube, ns):
    """The kubelet puts a deleted pod in a terminal phase before letting it go; the eviction's DisruptionTarget
    condition stays. A Job whose podFailurePolicy ignores disruptions then neither counts the pod as a failure
    nor fails, though its backoffLimit is 0."""
    spec = job("evicted", ["sleep", "300"], backoff=0)
    spec["spec"]["podFailurePolicy"] = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    spec["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    create(kube, ns, spec)
    first = wait_for(lambda: (p := pod_of(kube, ns, "job-name=evicted")) and p["status"].get("phase") == "Running"
                     and p, 60, what="the Job's pod Running")["metadata"]["name"]
    kube.request("POST", kube.path("Pod", first, ns, "eviction"),
                 {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": first, "namespace": ns}})
    wait_for(lambda: [p for p in kube.list("Pod", ns, label_selector="job-name=evicted")
                      if p["metadata"]["name"] != first and p["status"].get("phase") == "Running"], 60,
             what="a replacement pod Running")
    status = kube.get("Job", "evicted", ns)["status"]
    assert job_condition(kube, ns, "evicted") is None, status
    assert not status.get("failed"), status


def test_job_active_deadline_stops_a_long_job(kube, ns):
    obj = job("slow", ["sleep", "300"])
    obj["spec"]["activeDeadlineSeconds"] = 3
    create(kube, ns, obj)
    cond = wait_for(lambda: job_condition(kube, ns, "slow"), 60, what="Job DeadlineExceeded")
    assert cond["type"] == "Failed" and cond["reason"] == "DeadlineExceeded"


def test_pod_active_deadline_is_enforced_by_the_node(kube, ns):
    create(kube, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "deadline"},
                      "spec": {"restartPolicy": "Never", "activeDeadlineSeconds": 2,
                               "containers": [{"name": "c", "image": "x", "command": ["sleep", "60"]}]}})
    pod = wait_for(lambda: (p := kube.get("Pod", "deadline", ns)) and p["status"].get("phase") == "Failed" and p,
                   30, what="pod Failed")
    assert pod["status"]["reason"] == "DeadlineExceeded"


def test_sandbox_is_unprivileged_and_off_the_hosts_network(kube, ns, kubectl):
    script = ("id -u; cat /proc/net/dev | grep -c ':' ; "
              "(exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null && echo reachable || echo unreachable; "
              "echo $GREETING; pwd")
    create(kube, ns, job("probe-sandbox", ["bash", "-c", script],
                         ))
    j = kube.get("Job", "probe-sandbox", ns)
    assert j
    wait_for(lambda: job_condition(kube, ns, "probe-sandbox"), 60, what="Job finished")
    lines = kubectl("-n", ns, "logs", "job/probe-sandbox").stdout.split()
    if sandbox.kind() == "process":
        # The weaker sandbox, as documented: the container's user, no namespaces (so the
        # host's network is there), a private working directory.
        assert lines[0] == ("65534" if os.geteuid() == 0 else str(os.geteuid()))
        assert lines[-1].endswith("/work")
        return
    # As root gpulab runs containers as nobody; as an ordinary user they run as the root of a
    # user namespace that maps only that user: no more privilege than the learner has.
    assert lines[0] == ("65534" if os.geteuid() == 0 else "0")
    assert lines[1] == "2"              # its loopback and eth0, the pod network's (the CNI bridge plugin's veth)
    assert lines[2] == "unreachable"    # the host's loopback is not the pod's


def test_env_and_configmap_volume_and_init_containers_in_order(kube, ns, kubectl):
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns},
                 "data": {"model": "llama-7b", "batch": "8"}})
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ordered"},
        "spec": {
            "restartPolicy": "Never",
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "settings"}}],
            "initContainers": [
                {"name": "fetch", "image": "x", "command": ["sh", "-c", "echo fetched > /data/1"],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "unpack", "image": "x", "command": ["sh", "-c", "cat /data/1 > /data/2; echo unpacked >> /data/2"],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            ],
            "containers": [{
                "name": "train", "image": "x",
                "command": ["sh", "-c", "cat /data/2; cat /etc/cfg/model; echo \" $MODEL $POD\""],
                "env": [{"name": "MODEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "model"}}},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True}],
            }],
        },
    }
    create(kube, ns, pod)
    wait_for(lambda: (p := kube.get("Pod", "ordered", ns)) and p["status"].get("phase") == "Succeeded", 60,
             what="pod Succeeded")
    out = kubectl("-n", ns, "logs", "ordered").stdout
    assert out.split() == ["fetched", "unpacked", "llama-7b", "llama-7b", "ordered"]


def test_checkpoint_on_a_pvc_survives_the_pod(kube, ns, kubectl):
    kube.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": "ckpt", "namespace": ns},
                 "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    script = ("step=$(cat /ckpt/step 2>/dev/null || echo 0); echo resuming from $step; "
              "echo $((step+10)) > /ckpt/step")

    def run(name):
        create(kube, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                          "spec": {"restartPolicy": "Never",
                                   "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
                                   "containers": [{"name": "train", "image": "x", "command": ["sh", "-c", script],
                                                   "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}]}})
        wait_for(lambda: (p := kube.get("Pod", name, ns)) and p["status"].get("phase") == "Succeeded", 60,
                 what=f"{name} Succeeded")
        return kubectl("-n", ns, "logs", name).stdout.strip()

    assert run("first") == "resuming from 0"
    assert kube.get("PersistentVolumeClaim", "ckpt", ns)["status"]["phase"] == "Bound"
    kube.delete("Pod", "first", ns)
    assert run("second") == "resuming from 10"


def test_deployment_becomes_available_with_simulated_containers(kube, ns):
    create(kube, ns, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                      "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                               "template": {"metadata": {"labels": {"app": "web"}},
                                            "spec": {"containers": [{"name": "web",
                                                                     "image": "registry.example.com/web:1.0"}]}}}})
    dep = wait_for(lambda: (d := kube.get("Deployment", "web", ns)) and d.get("status", {}).get("availableReplicas") == 2
                   and d, 60, what="Deployment Available")
    assert dep["status"]["readyReplicas"] == 2


def _inference_pod(name: str, load: int, failure_threshold: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpulab.io/model-load-seconds": str(load)}},
        "spec": {"containers": [{
            "name": "server", "image": "vllm/vllm-openai",
            "startupProbe": {"httpGet": {"path": "/health", "port": 8000},
                             "periodSeconds": 1, "failureThreshold": failure_threshold},
            "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
        }]},
    }


def test_startup_probe_shorter_than_model_load_restarts_the_container(kube, ns):
    create(kube, ns, _inference_pod("too-short", load=6, failure_threshold=2))
    pod = wait_for(lambda: (p := kube.get("Pod", "too-short", ns))
                   and (p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1 and p,
                   40, what="container restarted by the startup probe")
    cs = pod["status"]["containerStatuses"][0]
    assert cs["ready"] is False
    events = kube.list("Event", ns, field_selector="involvedObject.name=too-short")
    assert any(e["reason"] == "Killing" and "failed startup probe, will be restarted" in e["message"]
               for e in events)


def test_startup_probe_longer_than_model_load_lets_it_become_ready(kube, ns):
    create(kube, ns, _inference_pod("long-enough", load=3, failure_threshold=10))
    pod = wait_for(lambda: (p := kube.get("Pod", "long-enough", ns))
                   and (p["status"].get("containerStatuses") or [{}])[0].get("ready") and p,
                   40, what="container Ready")
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
