"""Does the grading jail hide the host, keep the repository read-only and relay only the apiserver?

These run real namespaces (root or unprivileged user namespaces, as the pod
sandbox needs) but no cluster; a shell inside the jail reports what it sees.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpulab.grading.jail import Jail
from gpulab.grading.record import load_results
from gpulab.grading.runner import Runner
from grading_support import notebook, write

REPO = Path(__file__).resolve().parents[2]


def run_inside(jail: Jail, script: str, relay_port: int | None = None, upstream=None) -> subprocess.CompletedProcess:
    run_dir = jail.make_run_dir()
    spec = jail.spec(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin", "RUN": str(run_dir)}, run_dir, run_dir,
                     relay_port)
    spec_path = run_dir / ".jail.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    try:
        with jail.relay(run_dir / "apiserver.sock", upstream):
            return subprocess.run(jail.command(spec_path), capture_output=True, text=True, timeout=60)
    finally:
        jail.cleanup(spec)
        import shutil

        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def jail():
    j = Jail(mask=[REPO / "tests" / "fixtures" / "hidden"])
    j.check()
    return j


def test_the_host_is_out_of_sight_and_the_repository_read_only(jail, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("grader only")
    script = (f"cat {secret} 2>/dev/null || echo no-secret; "
              f"ls {REPO / 'tests' / 'fixtures' / 'hidden'} | wc -l; "
              f"touch {REPO / 'jail-was-here'} 2>/dev/null && echo wrote-repo || echo repo-read-only; "
              "echo ok > \"$RUN/out\" && cat \"$RUN/out\"; "
              f"test -x {sys.executable} && echo python-there; "
              "ls ~ 2>/dev/null | head -1; grep -c : /proc/net/dev; "
              "grep CapEff /proc/self/status | tr -d '\\t'; id -u")
    proc = run_inside(jail, script)
    lines = proc.stdout.split("\n")
    assert proc.returncode == 0, proc.stderr
    assert lines[:5] == ["no-secret", "0", "repo-read-only", "ok", "python-there"]
    assert lines[5] == "1"  # only the loopback interface of its own network namespace
    assert lines[6] == "CapEff:0000000000000000"
    assert int(lines[7]) == (65534 if os.geteuid() == 0 else os.geteuid())
    assert not (REPO / "jail-was-here").exists()


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"through the relay")

    def log_message(self, *args):
        pass


def test_only_the_relayed_port_is_reachable(jail):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port, other_port = server.server_address[1], other.server_address[1]
    probe = ("import urllib.request as u\n"
             "def get(p):\n"
             "    try:\n        return u.urlopen(f'http://127.0.0.1:{p}', timeout=3).read().decode()\n"
             "    except Exception as e:\n        return type(e).__name__\n"
             f"print(get({port})); print(get({other_port}))")
    try:
        proc = run_inside(jail, f"{sys.executable} -I -c \"{probe}\"", relay_port=port, upstream=("127.0.0.1", port))
    finally:
        server.shutdown()
        other.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["through", "the", "relay", "URLError"]


def test_a_jailed_notebook_runs_and_its_outputs_come_back(tmp_path, jail):
    nb = write(notebook([
        "import os, gpulab.grading as g\n"
        "g.record('uid', os.getuid())\n"
        "g.record('cwd_writable', os.access(os.getcwd(), os.W_OK))\n"
        f"g.record('secret', os.path.exists({str(tmp_path)!r}))",
    ]), tmp_path / "sub" / "nb.ipynb")
    made = []
    original = jail.make_run_dir
    jail.make_run_dir = lambda: made.append(original()) or made[-1]
    try:
        ex = Runner(cell_timeout=30, timeout=90, jail=jail).run(nb, tmp_path / "work")
    finally:
        del jail.make_run_dir
    assert ex.ok, (ex.message, ex.traceback, ex.log_path.read_text() if ex.log_path else "")
    values = load_results(ex.results_path)
    assert values == {"uid": 65534 if os.geteuid() == 0 else os.geteuid(), "cwd_writable": True, "secret": False}
    assert ex.output_path and ex.output_path.parent == tmp_path / "work"
    assert len(made) == 1 and not made[0].exists()  # the private run directory is gone
