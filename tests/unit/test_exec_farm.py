"""The exec farm (``<cluster>/exec-path``): a link to the dispatcher for every program a container's PATH offers.

KWOK looks up a ``kubectl exec`` program on its PATH, the farm first; a program without a link there
is found further down, on the host, and runs outside the container. Programs installed on the host
after the node agent started must get their link too (found by Kubernetes' e2e specs: ``nc`` installed
after ``gpulab up`` ran in the host's network, where Service names do not resolve).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gpulab.runtime import sandbox, streaming


def _program(directory: Path, name: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_the_farm_links_every_program_and_later_ones_on_a_rewrite(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _program(bin_dir, "sh")
    (bin_dir / "notes.txt").write_text("not a program")
    monkeypatch.setattr(sandbox, "DEFAULT_PATH", str(bin_dir))
    farm = streaming.write_farm(tmp_path / "cluster")
    assert os.readlink(farm / "sh") == streaming.DISPATCHER
    assert not (farm / "notes.txt").exists()
    assert not (farm / "nc").exists()

    _program(bin_dir, "nc")  # installed while the cluster runs
    streaming.write_farm(tmp_path / "cluster")
    assert os.readlink(farm / "nc") == streaming.DISPATCHER
    assert os.readlink(farm / "sh") == streaming.DISPATCHER


def test_keep_farm_adds_a_program_installed_after_the_start_until_stopped(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _program(bin_dir, "sh")
    monkeypatch.setattr(sandbox, "DEFAULT_PATH", str(bin_dir))
    cluster = tmp_path / "cluster"
    farm = streaming.write_farm(cluster)
    stop = threading.Event()
    keeper = threading.Thread(target=streaming.keep_farm, args=(cluster, stop, 0.05), daemon=True)
    keeper.start()
    try:
        _program(bin_dir, "dig")
        deadline = time.monotonic() + 5
        while not (farm / "dig").is_symlink() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.readlink(farm / "dig") == streaming.DISPATCHER
    finally:
        stop.set()
        keeper.join(timeout=2)
    assert not keeper.is_alive()
