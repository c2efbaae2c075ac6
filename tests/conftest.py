"""Shared fixtures: one embedded cluster per test session, a namespace per test.

The cluster lives under a fresh ``GPULAB_HOME`` in /tmp (short paths: unix
sockets of device plugins must stay under 108 bytes) and is always torn down,
even when tests fail. Binaries come from the shared build cache.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
import pytest

from helpers import wait_for

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items):
    # The notebooks first: one module of some thirteen minutes, which pytest-xdist (--dist loadscope)
    # hands out in this order, so it starts at once on one worker while the other takes the rest.
    items.sort(key=lambda item: not item.nodeid.startswith("tests/notebooks/test_notebooks.py"))


def pytest_configure(config):
    # A CI timeout or `kill` sends SIGTERM: treat it as Ctrl-C, so that fixtures
    # still stop the session cluster instead of leaving its servers running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # The tests read gpulab's messages in English, whatever the developer's locale (gpulab/i18n.py): LANGUAGE
    # comes first in gettext's choice and moves nothing but messages. A test of another language sets its own;
    # a lesson's setup() sets zh_CN for its kernel and its commands.
    os.environ["LANGUAGE"] = "en"


@pytest.fixture(scope="session")
def gpulab_home():
    home = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))
    # `kubectl exec` runs as nobody (as pods do), which must reach its workdir
    # and nvidia-smi under here; mkdtemp makes the directory private.
    home.chmod(0o755)
    old = os.environ.get("GPULAB_HOME")
    os.environ["GPULAB_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("GPULAB_HOME", None)
    else:
        os.environ["GPULAB_HOME"] = old
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(gpulab_home):
    # `make test BACKEND=kind` (GPULAB_TEST_BACKEND=kind): a kind cluster of its own name, Docker needed.
    if os.environ.get("GPULAB_TEST_BACKEND", "embedded") == "kind":
        from gpulab.cluster import backend
        from gpulab.cluster.kind import KindCluster

        backend.choose("kind")
        c = KindCluster(gpulab_home / "kind", name=f"gpulab-test-{uuid.uuid4().hex[:6]}")
    else:
        from gpulab.cluster.embedded import EmbeddedCluster

        c = EmbeddedCluster(gpulab_home / "cluster")
    try:
        c.up(say=lambda m: print(f"gpulab: {m}", file=sys.stderr))
        yield c
    finally:
        c.down(purge=True)


@pytest.fixture(scope="session")
def kube(cluster):
    from gpulab.kube.api import Client

    return Client(cluster.kubeconfig)


@pytest.fixture
def ns(kube):
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    # The service-account controller creates "default"; pods need it.
    wait_for(lambda: kube.get("ServiceAccount", "default", name), 30, what="default service account")
    yield name
    kube.delete("Namespace", name)


@pytest.fixture(scope="session")
def kubectl(cluster):
    exe = str(Path(sys.executable).parent / "kubectl")

    def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([exe, "--kubeconfig", str(cluster.kubeconfig), *args],
                              capture_output=True, text=True, input=input, timeout=60)
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    return run
