"""Lab fixtures and the grading secret: what the grader breaks, picked so that only the secret's holder knows.

No cluster: the fixtures' picks are pure functions of (secret, namespace, nodes); the grading
secret is a file in ``GPULAB_HOME``; learner notebooks import practice helpers from the
fixtures, never a check module.
"""

from __future__ import annotations

import hashlib
import json
import stat
import threading
from pathlib import Path

import pytest
import yaml

from gpulab.cluster import baseline
from gpulab.grading import fixtures, journal, secret
from gpulab.grading.cluster import MONITORING_GRANTS, LabEnv, load_lab_spec
from gpulab.grading.fixtures import broken_layer, broken_pipeline, gpu_trouble
from gpulab.grading.labs import lab_02, lab_08, lab_09
from grading_support import FakeClient

REPO = Path(__file__).resolve().parents[2]
NODES = {"gpu-node-1": 2, "gpu-node-2": 8}
KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# --------------------------------------------------------------------------- the secret


def test_the_secret_is_made_once_atomically_private_and_then_kept(home):
    said = []
    assert secret.load() is None
    key = secret.ensure(say=said.append)
    path = home / "grading" / "secret"
    assert secret.path() == path and len(key) == secret.KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(said) == 1 and str(path) in said[0] and "never share it" in said[0]
    # Regrading: the same secret, nothing said again, no temporary files left.
    assert secret.ensure(say=said.append) == key == secret.load() and len(said) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]


def test_graders_starting_at_once_agree_on_one_secret(home):
    keys, barrier = [], threading.Barrier(8)

    def grader():
        barrier.wait()
        keys.append(secret.ensure())

    threads = [threading.Thread(target=grader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1 and keys[0] == secret.load()


def test_an_unusable_secret_is_an_error_that_says_what_to_do(home):
    path = secret.path()
    path.parent.mkdir(parents=True)
    path.write_text("not hex\n")
    path.chmod(0o600)
    with pytest.raises(secret.SecretError, match="not a gpulab grading secret.*delete it"):
        secret.ensure()
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o644)
    with pytest.raises(secret.SecretError, match=r"readable by others \(mode 0644\).*chmod 600"):
        secret.load()
    path.chmod(0o600)
    assert secret.load() == bytes.fromhex("ab" * 32)


def test_derive_is_keyed():
    assert secret.derive(KEY_A, "x", "ns") == secret.derive(KEY_A, "x", "ns")
    assert secret.derive(KEY_A, "x", "ns") != secret.derive(KEY_B, "x", "ns")
    assert secret.derive(KEY_A, "x", "ns") != secret.derive(KEY_A, "x", "ns2")
    assert secret.derive(KEY_A, "ab", "c") != secret.derive(KEY_A, "a", "bc")  # parts stay apart
    with pytest.raises(ValueError):
        secret.derive(b"short", "x")


# --------------------------------------------------------------------------- lab 02: one broken layer


def test_lab02_scenario_is_fixed_per_secret_and_submission_and_covers_every_layer():
    picked = {broken_layer.scenario(f"grade-02-l{i}", NODES, KEY_A) for i in range(40)}
    assert {layer for _, layer, _ in picked} == set(broken_layer.LAYERS)
    assert {node for node, _, _ in picked} == set(NODES)
    assert all((gpu is None) == (layer != "gpu") and (gpu is None or 0 <= gpu < NODES[node])
               for node, layer, gpu in picked)
    assert {node for node, layer, _ in picked if layer == "container-toolkit"} == {"gpu-node-1"}
    # Regrading with the same secret breaks the same thing.
    assert broken_layer.scenario("grade-02-amy", NODES, KEY_A) == broken_layer.scenario("grade-02-amy", NODES, KEY_A)


def test_lab02_scenario_cannot_be_computed_from_the_namespace_alone():
    namespaces = [f"grade-02-learner{i}" for i in range(400)]
    layers = {key: [broken_layer.scenario(ns, NODES, key)[1] for ns in namespaces] for key in (KEY_A, KEY_B)}
    agree = sum(a == b for a, b in zip(layers[KEY_A], layers[KEY_B])) / len(namespaces)
    # Two secrets agree about as often as chance does (1 in 4 layers), so knowing the namespace, the code and
    # one's own secret says nothing about the instructor's choice.
    assert 0.15 < agree < 0.35, agree
    # Nor does the old namespace-only derivation predict it.
    old = [list(broken_layer.LAYERS)[(int(hashlib.sha256(f"02-layered-verification/{ns}".encode()).hexdigest(), 16)
                                      // len(NODES)) % 4] for ns in namespaces]
    assert sum(a == b for a, b in zip(layers[KEY_A], old)) / len(namespaces) < 0.35
    # And a learner's `gpulab check` (check-02-<user>, their own secret) tells nothing about `gpulab grade`.
    assert [broken_layer.scenario(f"check-02-x{i}", NODES, KEY_B)[1] for i in range(16)] != \
        [broken_layer.scenario(f"grade-02-x{i}", NODES, KEY_A)[1] for i in range(16)]


def test_lab08_unhealthy_card_is_keyed_too():
    cards = {key: [gpu_trouble.unhealthy_card(f"grade-08-l{i}", "gpu-node-2", 8, key) for i in range(64)]
             for key in (KEY_A, KEY_B)}
    assert all(0 <= c < 8 for c in cards[KEY_A]) and set(cards[KEY_A]) == set(range(8))
    assert cards[KEY_A] == [gpu_trouble.unhealthy_card(f"grade-08-l{i}", "gpu-node-2", 8, KEY_A) for i in range(64)]
    assert sum(a == b for a, b in zip(cards[KEY_A], cards[KEY_B])) < 24  # chance: 8 of 64


def test_lab09_scenario_is_keyed_and_covers_every_link():
    picked = [broken_pipeline.scenario(f"grade-09-l{i}", KEY_A) for i in range(40)]
    assert set(picked) == set(broken_pipeline.FAULTS)
    assert {broken_pipeline.FAULTS[f].link for f in picked} == set(broken_pipeline.LINKS)
    assert picked == [broken_pipeline.scenario(f"grade-09-l{i}", KEY_A) for i in range(40)]
    other = [broken_pipeline.scenario(f"grade-09-l{i}", KEY_B) for i in range(40)]
    assert sum(a == b for a, b in zip(picked, other)) < 20  # chance: 1 in 4


@pytest.mark.parametrize("name", sorted(broken_pipeline.FAULTS))
def test_lab09_each_fault_edits_the_installed_config_in_place(name):
    """A colleague's edit of the add-on's own text: one place, the rest (comments too) as installed, still YAML."""
    fault = broken_pipeline.FAULTS[name]
    good = broken_pipeline.installed_text(fault.configmap, fault.key)
    bad = fault.apply(good)
    assert bad != good and isinstance(yaml.safe_load(bad), dict)
    lines = broken_pipeline.changed_lines(good, bad)
    assert lines and all(line in bad for line in lines)
    undone = bad
    for old, new in fault.edits:
        assert undone.count(new) == 1
        undone = undone.replace(new, old)
    assert undone == good
    with pytest.raises(Exception, match="expected .* once"):
        fault.apply(bad)  # the installed text is gone: a second edit would be guesswork


def test_lab09_setup_grants_the_monitoring_namespace_breaks_one_link_and_reports_it(home, monkeypatch):
    told = []
    monkeypatch.setattr(broken_pipeline, "ensure_installed", lambda env: told.append("installed"))
    monkeypatch.setattr(broken_pipeline.addons, "reconfigure",
                        lambda kubeconfig, name, configmaps, say: told.append((name, list(configmaps))))
    waited = []
    monkeypatch.setattr(broken_pipeline, "wait_targets", lambda client, in_effect, what: waited.append(in_effect))
    installed = broken_pipeline.installed_configs()
    client = FakeClient([{"kind": "ConfigMap", "metadata": {"name": n, "namespace": "monitoring"}, "data": dict(d)}
                         for n, d in installed.items()])
    env = LabEnv(client, home, "grade-09-amy", "amy")
    [record] = broken_pipeline.setup(env)
    name = broken_pipeline.scenario("grade-09-amy", secret.load())
    fault = broken_pipeline.FAULTS[name]
    assert told == ["installed", ("monitoring", [f"monitoring/{fault.configmap}"])]
    # A change of Prometheus's scrape config: the run starts once the targets show it (a reload relabels late).
    assert waited == ([fault.in_effect] if fault.configmap == "prometheus-config" else [])
    live = client.get("ConfigMap", fault.configmap, "monitoring")["data"][fault.key]
    assert live == fault.apply(installed[fault.configmap][fault.key])
    assert record["kind"] == "InjectedFault" and record["fault"] == name and record["link"] == fault.link
    assert record["lines"] == broken_pipeline.changed_lines(installed[fault.configmap][fault.key], live)
    assert record["installed"] == installed
    role = client.get("Role", "gpulab:grading:grade-09-amy", "monitoring")
    assert role["rules"] == MONITORING_GRANTS["monitoring"]
    binding = client.get("RoleBinding", "gpulab:grading:grade-09-amy", "monitoring")
    assert binding["subjects"][0]["name"].startswith("gpulab-grader:amy")
    # COLLECT: the ConfigMaps as the run left them, for the checks.
    assert {cm["metadata"]["name"]: cm["data"] for cm in broken_pipeline.collect(client)["ConfigMap"]}[
        fault.configmap][fault.key] == live

    put_back = []
    monkeypatch.setattr(broken_pipeline.baseline, "addon_back",
                        lambda kubeconfig, name, say, tell: put_back.append((name, tell)))
    broken_pipeline.teardown(env)
    # Prometheus reloads (or the adapter restarts) even if the run put the text back without telling it.
    assert put_back == [("monitoring", [f"monitoring/{fault.configmap}"])]
    assert waited[1:] == ([broken_pipeline.as_installed] if fault.configmap == "prometheus-config" else [])
    assert client.get("Role", "gpulab:grading:grade-09-amy", "monitoring") is None
    assert client.get("RoleBinding", "gpulab:grading:grade-09-amy", "monitoring") is None


class _Client:
    """Node statuses for ``gpu_resources``; nothing else is asked in these tests."""

    def __init__(self, **statuses):
        self.statuses = statuses

    def get(self, kind, name):
        cap, alloc = self.statuses[name]
        return {"status": {"capacity": cap, "allocatable": alloc}}


def test_setup_picks_with_the_secret_of_gpulab_home(home, monkeypatch):
    """SETUP breaks what scenario() picks under $GPULAB_HOME's secret (made on first use), and tells the checks."""
    calls = []
    monkeypatch.setattr(broken_layer, "teardown", lambda env: calls.append("repaired"))
    monkeypatch.setattr(broken_layer, "gpu_nodes", lambda env: {"gpu-node-1": 2})
    monkeypatch.setattr(broken_layer, "set_faults", lambda env, wanted: calls.append(wanted))
    monkeypatch.setattr(broken_layer, "wait", lambda fn, timeout, what: None)
    env = LabEnv(_Client(), None, "grade-02-amy", "amy")
    [record] = broken_layer.setup(env)
    key = secret.load()
    assert key is not None  # created by the first SETUP
    node, layer, gpu = broken_layer.scenario("grade-02-amy", {"gpu-node-1": 2}, key)
    assert calls == ["repaired", {node: [(broken_layer.LAYERS[layer], gpu)]}]
    assert record == {"kind": "InjectedFault", "apiVersion": "gpulab.io/v1", "metadata": {"name": node},
                      "node": node, "layer": layer, "faults": [{"kind": broken_layer.LAYERS[layer], "gpu": gpu}]}


def test_repair_waits_for_the_advertised_resources_only():
    whole = baseline.resources_whole
    # After MIG: the kubelet keeps the slices' capacity at allocatable 0 through its stop grace period.
    lingering = ({"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "4"},
                 {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "0"})
    assert whole(_Client(**{"gpu-node-1": lingering}), {"gpu-node-1": 2})
    one_unhealthy = ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"})
    assert not whole(_Client(**{"gpu-node-1": one_unhealthy}), {"gpu-node-1": 2})
    assert fixtures.gpu_resources(_Client(**{"gpu-node-1": one_unhealthy}), "gpu-node-1") == (2, 1)
    plugin_gone = ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "0"})
    assert not whole(_Client(**{"gpu-node-1": plugin_gone}), {"gpu-node-1": 2})
    assert not whole(_Client(**{"gpu-node-1": ({}, {})}), {"gpu-node-1": 2})


# --------------------------------------------------------------------------- where fault injection lives


def test_check_modules_declare_fixtures_and_hold_no_fault_injection():
    for module, fixture, changes in ((lab_02, broken_layer, ("faults",)), (lab_08, gpu_trouble, ("faults", "nodes")),
                                     (lab_09, broken_pipeline, ("monitoring",))):
        spec = load_lab_spec(module.LAB[:2])
        assert spec.setup is fixture.setup and spec.teardown is fixture.teardown
        assert set(changes) <= set(journal.declared(spec.setup)) and set(journal.declared(spec.setup)) <= \
            {*changes, *journal.ALWAYS}
        for name in ("practice_break", "practice_repair", "scenario", "set_faults", "repair", "gpu_nodes_of"):
            assert not hasattr(module, name), f"{module.__name__}.{name}: fault injection belongs in the fixtures"
        assert callable(fixture.practice_break) and callable(fixture.practice_repair)
    assert lab_02.CLUSTER_RULES == lab_08.CLUSTER_RULES == fixtures.DIAGNOSE_RULES


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "code"]


def test_learner_notebooks_import_no_check_module():
    # solutions/ too where there is one (a learner distribution has none).
    notebooks = [p for folder in ("labs", "notebooks", "solutions") for p in sorted((REPO / folder).glob("*.ipynb"))]
    assert len(notebooks) >= 16
    for path in notebooks:
        for source in _code_cells(path):
            assert "gpulab.grading.labs" not in source, f"{path.relative_to(REPO)} imports a check module"
    practice = {p.name: [s for s in _code_cells(p) if "practice_break" in s] for p in (REPO / "labs").glob("*.ipynb")}
    assert "from gpulab.grading.fixtures.broken_layer import practice_break" in practice[
        "02-layered-verification.ipynb"][0]
    assert "from gpulab.grading.fixtures.gpu_trouble import practice_break" in practice["08-troubleshooting.ipynb"][0]
    assert "from gpulab.grading.fixtures.broken_pipeline import practice_break" in practice[
        "09-hpa-not-scaling.ipynb"][0]


def test_fixtures_live_in_gpulab_home_not_the_checkout(home):
    key = fixtures.grading_key()
    assert (home / "grading" / "secret").is_file() and key == secret.load()


def test_lab09_prometheus_faults_say_how_the_dcgm_targets_look_once_in_effect():
    installed = [{"labels": {"instance": "10.244.2.5:9400", "job": "dcgm-exporter", "node": "gpu-node-1"}}]
    relabelled = [{"labels": {**installed[0]["labels"], "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x"}}]
    faults = broken_pipeline.FAULTS
    assert broken_pipeline.as_installed(installed) and not broken_pipeline.as_installed(relabelled)
    assert not broken_pipeline.as_installed([])
    assert faults["exported-pod"].in_effect(relabelled) and not faults["exported-pod"].in_effect(installed)
    assert faults["keep-regex"].in_effect([]) and not faults["keep-regex"].in_effect(installed)
    assert all(f.in_effect is None for f in faults.values() if f.configmap != "prometheus-config")
