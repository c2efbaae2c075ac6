"""A lesson or a lab on a stopped cluster: it is started, or the learner is told exactly what to run.

kubectl's own "The connection to the server 127.0.0.1:… was refused" never stands alone in a lesson's
``sh("kubectl ...")`` or a lab's ``kubectl(...)``: gpulab's note follows it. Real kubectl 1.37 against a port
nothing listens on; the cluster object is a fake (tests/browser/test_first_hour_browser.py starts a real one).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gpulab import paths
from gpulab.cluster import backend
from gpulab.cluster.base import ClusterError
from gpulab.grading import labkit
from gpulab.notebook import lesson, shell


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: x}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    return path


class FakeCluster:
    """A stopped cluster: ``up`` says two progress lines (or fails) and writes the kubeconfig."""

    def __init__(self, exists: bool = True, up_error: Exception | None = None, running: bool = False):
        self._exists, self.up_error, self.running, self.ups = exists, up_error, running, 0

    def is_up(self) -> bool:
        return self.running

    def exists(self) -> bool:
        return self._exists

    def up(self, say) -> str:
        self.ups += 1
        if self.up_error:
            raise self.up_error
        say("启动 etcd")
        say("3 个节点已 Ready，用时 5.0 秒")
        backend.kubeconfig().parent.mkdir(parents=True, exist_ok=True)
        _kubeconfig(backend.kubeconfig(), _closed_port())
        self.running = True
        return "集群已启动"


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    """A GPULAB_HOME without a running cluster, and kubectl 1.37 first on PATH with a kubeconfig nobody answers."""
    monkeypatch.setenv("GPULAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(paths.kubectl()).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kubeconfig", _closed_port())))
    monkeypatch.setenv("LANGUAGE", "en")
    return tmp_path


def test_sh_follows_kubectls_connection_error_with_what_to_run(stopped, capsys):
    with pytest.raises(shell.CommandFailed) as err:
        shell.sh("kubectl get nodes")
    out = capsys.readouterr().out
    assert "was refused" in out  # kubectl's own words stay
    assert "⚠ gpulab：kubectl 连不上集群，因为集群没有在运行" in out and "`gpulab up`" in out
    assert out.index("was refused") < out.index("⚠ gpulab")
    assert "第一个代码格" in str(err.value) and "`gpulab up`" in str(err.value)  # the traceback's last line too
    # Whatever the exit status: the error is never shown alone.
    shell.sh("kubectl get nodes || true")
    assert "⚠ gpulab：kubectl 连不上集群" in capsys.readouterr().out


def test_sh_on_a_running_cluster_at_another_address_says_to_rerun_setup(stopped, monkeypatch, capsys):
    monkeypatch.setattr(backend, "current", lambda name=None: FakeCluster(running=True))
    shell.sh("kubectl get nodes", check=False)
    out = capsys.readouterr().out
    assert "⚠ gpulab：集群在运行，但 kubectl 还在连集群上次启动时的地址" in out and "setup()" in out


def test_sh_says_nothing_more_when_kubectl_connects_or_fails_otherwise(stopped, capsys):
    shell.sh("echo 'error: the server doesn't have a resource type \"nodez\"'; exit 1", check=False)
    assert "gpulab：" not in capsys.readouterr().out
    shell.sh("kubectl get nodes", check=False, quiet=True)
    assert capsys.readouterr().out == ""


def test_a_labs_kubectl_says_what_to_run_by_hand_and_not_under_the_grader(stopped, monkeypatch, capsys):
    monkeypatch.setattr(labkit, "_lab", labkit.Lab("lab-01", stopped / "work", False, "kc"))
    note = backend.unreachable_note(labkit.FIRST_CELL)
    assert "begin(" in note and "`gpulab up`" in note and "kubectl 连不上集群" in note
    with pytest.raises(labkit.KubectlFailed) as err:
        labkit.kubectl("get pods")
    assert "was refused" in str(err.value) and note in str(err.value)
    assert f"⚠ {note}" in capsys.readouterr().out
    outcome = labkit.try_kubectl("get pods")
    assert not outcome.ok and note in capsys.readouterr().out

    monkeypatch.setattr(labkit, "_lab", labkit.Lab("lab-01", stopped / "work", True, "kc"))
    with pytest.raises(labkit.KubectlFailed) as err:
        labkit.kubectl("get pods")
    assert "gpulab：" not in str(err.value) + capsys.readouterr().out


@pytest.fixture
def kernel():
    """An IPython shell, as a notebook's kernel has (get_ipython() finds it)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def test_the_python_clients_connection_error_in_a_notebook_says_what_to_run(stopped, kernel, capsys):
    backend.explain_client_errors(shell.FIRST_CELL)
    result = kernel.run_cell("from kubernetes import client, config\n"
                             "import os; config.load_kube_config(os.environ['KUBECONFIG'])\n"
                             "client.CoreV1Api().list_node(_request_timeout=5)\n")
    out = capsys.readouterr().out
    assert type(result.error_in_exec).__name__ == "MaxRetryError"  # the cell still fails
    assert "Connection refused" in out  # the client's own words stay, above the note
    assert "⚠ gpulab：Python 客户端 连不上集群，因为集群没有在运行" in out and "setup()" in out and "`gpulab up`" in out
    assert out.index("Connection refused") < out.index("⚠ gpulab")
    # Other errors are shown as before, with no note.
    kernel.run_cell("raise ValueError('nope')")
    assert "gpulab：" not in capsys.readouterr().out


def test_a_lessons_setup_that_cannot_start_the_cluster_says_why_and_what_to_run(stopped, monkeypatch, capsys):
    monkeypatch.chdir(stopped)  # setup() moves to the repository root
    cluster = FakeCluster(exists=False, up_error=ClusterError("no user namespaces here: sysctl ..."))
    monkeypatch.setattr(backend, "current", lambda name=None: cluster)
    with pytest.raises(RuntimeError) as err:
        lesson.setup("00-orientation")
    assert cluster.ups == 1
    assert str(err.value).startswith("集群没能启动：no user namespaces here: sysctl ...\n")
    assert "`gpulab up`" in str(err.value)
    assert capsys.readouterr().out == "集群没有在运行，现在启动它（第一次启动若要编译控制面，需要几分钟）……\n"
    assert os.environ["LANGUAGE"] == "zh_CN"  # set before bring-up: its lines are Chinese


def test_a_lessons_setup_with_start_false_says_what_to_run(stopped, monkeypatch):
    monkeypatch.chdir(stopped)
    cluster = FakeCluster()
    monkeypatch.setattr(backend, "current", lambda name=None: cluster)
    with pytest.raises(RuntimeError, match="`gpulab up`"):
        lesson.setup("00-orientation", start=False)
    assert cluster.ups == 0


class FakeKubectl:
    """labkit's kubectl runs: the apiserver does not answer until the cluster is up, then namespaces are made."""

    def __init__(self, cluster: FakeCluster):
        self.cluster, self.calls = cluster, []

    def __call__(self, args, input=None, timeout=120):
        self.calls.append(list(args))
        if not self.cluster.running:
            return 1, "The connection to the server 127.0.0.1:1 was refused - did you specify the right host or port?\n"
        if args[:2] == ["get", "namespace"]:
            return 1, f'Error from server (NotFound): namespaces "{args[2]}" not found\n'
        return 0, "ok\n"


def test_a_lab_begun_by_hand_on_a_stopped_cluster_starts_it(stopped, monkeypatch, capsys):
    cluster = FakeCluster()
    kubectl = FakeKubectl(cluster)
    monkeypatch.setattr(backend, "current", lambda name=None: cluster)
    monkeypatch.setattr(labkit, "_run", kubectl)
    monkeypatch.setattr(labkit, "_lab", None)
    # The cluster's own kubeconfig, as JupyterLab's kernels inherit it from `gpulab jupyter`: still by hand.
    monkeypatch.setenv("KUBECONFIG", str(backend.kubeconfig()))
    lab = labkit.begin("lab-01")
    assert cluster.ups == 1 and not lab.graded
    assert capsys.readouterr().out == ("集群没有在运行，现在启动它……\n  启动 etcd\n  3 个节点已 Ready，用时 5.0 秒\n"
                                       "集群已启动\n实验命名空间：lab-01\n")
    assert ["create", "namespace", "lab-01"] in kubectl.calls
    assert os.environ["KUBECONFIG"] == str(paths.home() / "labs" / "lab-01.kubeconfig")
    assert os.environ["LANGUAGE"] == "zh_CN"


def test_a_lab_begun_by_hand_on_a_running_cluster_loads_no_backend(stopped, monkeypatch, capsys):
    cluster = FakeCluster(running=True)
    backend.kubeconfig().parent.mkdir(parents=True)
    _kubeconfig(backend.kubeconfig(), _closed_port())
    monkeypatch.setattr(backend, "current", lambda name=None: pytest.fail("the backend was loaded"))
    monkeypatch.setattr(labkit, "_run", FakeKubectl(cluster))
    monkeypatch.setattr(labkit, "_lab", None)
    monkeypatch.delenv("KUBECONFIG")
    labkit.begin("lab-01")
    assert capsys.readouterr().out == "实验命名空间：lab-01\n"


def test_a_lab_that_cannot_start_the_cluster_says_why_and_what_to_run(stopped, monkeypatch):
    cluster = FakeCluster(exists=False, up_error=ClusterError("nft is missing: sudo apt-get install -y nftables"))
    monkeypatch.setattr(backend, "current", lambda name=None: cluster)
    monkeypatch.setattr(labkit, "_lab", None)
    monkeypatch.delenv("KUBECONFIG")
    with pytest.raises(RuntimeError) as err:
        labkit.begin("lab-01")
    assert str(err.value).startswith("集群没能启动：nft is missing: sudo apt-get install -y nftables\n")
    assert "`gpulab up`" in str(err.value)


def test_a_graded_lab_never_starts_a_cluster(stopped, monkeypatch):
    """Under the grader, KUBECONFIG is the submission's identity's: the grader owns the cluster."""
    monkeypatch.setattr(backend, "current", lambda name=None: pytest.fail("the backend was loaded"))
    monkeypatch.setattr(labkit, "_run", lambda args, input=None, timeout=120: (1, "Error from server (Forbidden)"))
    monkeypatch.setattr(labkit, "_lab", None)
    lab = labkit.begin("lab-01")
    assert lab.graded and lab.kubeconfig == os.environ["KUBECONFIG"] == str(stopped / "kubeconfig")
