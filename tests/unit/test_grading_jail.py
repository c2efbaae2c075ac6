"""Does the grading jail hide the host, keep the repository read-only and relay only the apiserver?

These run the sandbox ``GPULAB_SANDBOX`` chooses (namespaces: root or
unprivileged user namespaces, as pods need; process: proot) but no cluster; a
shell or a notebook inside the jail reports what it sees. The process sandbox
has no network of its own: the network assertions are the namespaces
sandbox's.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from gpulab.grading.jail import Jail
from gpulab.grading.record import load_results
from gpulab.grading.runner import Runner
from gpulab.runtime import sandbox
from grading_support import notebook, write

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "03-taints-tolerations.ipynb"


def own_network() -> bool:
    return sandbox.kind() == "namespaces"


def run_inside(jail: Jail, script: str, relay_port: int | None = None, upstream=None,
               keep=()) -> subprocess.CompletedProcess:
    if keep:
        jail = dataclasses.replace(jail, keep=[*jail.keep, *keep])
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
    if own_network():
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
    if own_network():
        assert proc.stdout.split() == ["through", "the", "relay", "URLError"]
    else:  # no relay: the kernel reaches the apiserver (and, alas, everything else) directly
        assert proc.stdout.split() == ["through", "the", "relay"] * 2


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


def test_only_the_package_and_the_manifests_of_the_repository_are_there(jail):
    exposed = sorted({p.relative_to(REPO).parts[0] for p in jail.kept() if REPO in p.parents})
    assert {"gpulab", "manifests"} <= set(exposed) and "solutions" not in exposed
    lab_file = REPO / "manifests" / "labs" / "03-taints-tolerations" / "web-plain.yaml"
    probe = f"import os; print(sorted(os.listdir({str(REPO)!r}))); print(os.path.isfile({str(lab_file)!r}))"
    proc = run_inside(jail, f"{sys.executable} -I -c \"{probe}\"")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == [repr(exposed), "True"]


def test_the_solutions_stay_out_of_reach_whatever_the_system_call(jail):
    """openat2 and a 64-bit program's int 0x80 (i386) calls reach files without the calls proot translates."""
    if not SOLUTION.is_file():
        pytest.skip(f"{SOLUTION} is not in this checkout")
    probe = f"""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
path = {str(SOLUTION)!r}.encode()
def show(name, fd):
    print(name, "open" if fd >= 0 else "refused")
how = (ctypes.c_uint64 * 3)()  # struct open_how: flags, mode, resolve
show("openat2", libc.syscall(437, -100, path, how, 24))
show("faccessat2", libc.syscall(439, -100, path, 4, 0))
page = None
if platform.machine() == "x86_64":
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    page = libc.mmap(None, 4096, 7, 0x22 | 0x40, -1, 0)  # rwx, private anonymous, below 4 GiB
if page not in (None, 2**64 - 1):
    ctypes.memmove(page + 1024, path + b"\\0", len(path) + 1)
    # push rbx; mov eax, 5 (i386 open); mov ebx, path; xor ecx, ecx; xor edx, edx; int 0x80; pop rbx; ret
    code = (b"\\x53\\xb8\\x05\\0\\0\\0\\xbb" + (page + 1024).to_bytes(4, "little")
            + b"\\x31\\xc9\\x31\\xd2\\xcd\\x80\\x5b\\xc3")
    ctypes.memmove(page, code, len(code))
    show("int80", ctypes.CFUNCTYPE(ctypes.c_int)(page)())
else:
    show("int80", -1)  # no such ABI here
"""
    script = Path(tempfile.mkdtemp(prefix="gl-probe-", dir="/tmp")) / "probe.py"
    script.write_text(probe)
    script.parent.chmod(0o755)
    try:
        proc = run_inside(jail, f"{sys.executable} -I -S {script}", keep=[script.parent])
    finally:
        shutil.rmtree(script.parent, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["openat2 refused", "faccessat2 refused", "int80 refused"]


def test_a_graded_submission_cannot_read_the_solutions(tmp_path, jail):
    if not SOLUTION.is_file():
        pytest.skip(f"{SOLUTION} is not in this checkout")
    nb = write(notebook([
        "import os, gpulab.grading as g\n"
        "from gpulab import paths\n"
        "def attempt(fn):\n"
        "    try:\n"
        "        return ['visible', repr(fn())[:80]]\n"
        "    except Exception as exc:\n"
        "        return ['blocked', type(exc).__name__]\n"
        f"solution = {str(SOLUTION)!r}\n"
        "g.record('absolute', attempt(lambda: open(solution).read()))\n"
        "g.record('relative', attempt(lambda: open(os.path.relpath(solution)).read()))\n"
        "repo = str(paths.repo_root())\n"
        "g.record('in_repo', attempt(lambda: os.open('solutions/' + os.path.basename(solution), os.O_RDONLY,\n"
        "                                            dir_fd=os.open(repo, os.O_RDONLY))))\n"
        "g.record('listed', 'solutions' in os.listdir(repo))\n",
        # What a lab needs is there: its files and the package, visible checks included (labs 02, 08).
        "from gpulab.grading.labkit import manifest\n"
        "from gpulab.grading.fixtures.broken_layer import practice_break\n"
        "g.record('manifest', manifest('03-taints-tolerations/web-plain.yaml').is_file())\n"
        "g.record('checks', callable(practice_break))",
    ]), tmp_path / "sub" / "nb.ipynb")
    ex = Runner(cell_timeout=30, timeout=90, jail=jail).run(nb, tmp_path / "work")
    assert ex.ok, (ex.message, ex.traceback, ex.log_path.read_text() if ex.log_path else "")
    assert load_results(ex.results_path) == {
        "absolute": ["blocked", "FileNotFoundError"], "relative": ["blocked", "FileNotFoundError"],
        "in_repo": ["blocked", "FileNotFoundError"], "listed": False, "manifest": True, "checks": True}


def test_the_next_grader_removes_what_a_killed_graders_jail_left(tmp_path):
    """Jail directories carry their grader's pid and start time; those of a dead grader go, a live one's stay."""
    import subprocess
    import sys

    from gpulab import _proc
    from gpulab.grading import jail as jail_mod

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_start = _proc.started(gone.pid)
    gone.wait()
    me = os.getpid()
    dead_run = tmp_path / f"gpulab-run-{gone.pid}-{int(gone_start)}-abc"
    dead_root = tmp_path / f"gpulab-jailroot-{gone.pid}-{int(gone_start)}-def"
    reused_pid = tmp_path / f"gpulab-run-{me}-{int(_proc.started(me)) - 3600}-ghi"  # our pid, another start
    live = tmp_path / f"{jail_mod._owned_prefix('run')}jkl"
    other = tmp_path / "gpulab-run-notes"
    for d in (dead_run, dead_root, reused_pid, live, other):
        (d / "home").mkdir(parents=True)
    assert sorted(jail_mod.sweep_stale(tmp_path)) == sorted([dead_run, dead_root, reused_pid])
    assert live.is_dir() and other.is_dir() and not dead_run.exists()


def _kubeconfig(path: Path, user: str) -> Path:
    path.write_text(f"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:6443'}}\n"
                    f"users:\n- name: {user}\n  user: {{token: {user}}}\n"
                    f"contexts:\n- name: c\n  context: {{cluster: c, user: {user}}}\ncurrent-context: c\n",
                    encoding="utf-8")
    return path


def test_a_warm_runner_hands_each_submission_a_kernel_started_ahead_in_a_jail_of_its_own(tmp_path, jail):
    """A batch's next submission finds its kernel started (the labs' modules loaded) in a fresh jail; it runs
    as its own identity; close() stops the standby nobody took."""
    nb = write(notebook([
        "import os, sys, gpulab.grading as g\n"
        "g.record('preloaded', 'kubernetes.client' in sys.modules)\n"
        "g.record('identity', open(os.environ['KUBECONFIG']).read().split('token: ')[1].split('}')[0])\n"
        "g.record('run_dir', os.environ['HOME'])\n"
        "g.record('count', get_ipython().execution_count)",
    ]), tmp_path / "sub" / "nb.ipynb")
    runner = Runner(cell_timeout=60, timeout=120, jail=jail, warm=1)
    seen = []
    try:
        for learner in ("alice", "bob"):
            env = {"KUBECONFIG": str(_kubeconfig(tmp_path / f"{learner}.kubeconfig", learner))}
            ex = runner.run(nb, tmp_path / "work", env=env, name=learner)
            assert ex.ok, (ex.message, ex.traceback, ex.log_path.read_text() if ex.log_path else "")
            seen.append(load_results(ex.results_path))
            [standby] = runner._standbys  # the next one's, started while this one ran
            assert standby.proc is not None and standby.proc.poll() is None
        assert [v["identity"] for v in seen] == ["alice", "bob"]
        # The modules were loaded silently: the cells count as in papermill's own kernel (parameters, injected, 4th).
        assert all(v["preloaded"] for v in seen) and [v["count"] for v in seen] == [4, 4]
        assert seen[0]["run_dir"] != seen[1]["run_dir"]
        assert (tmp_path / "work" / "bob.log").exists()
    finally:
        left = list(runner._standbys)
        runner.close()
    assert runner._standbys == [] and all(s.proc is None and not s.run_dir.exists() for s in left)
    assert not list((tmp_path / "work").glob(".standby-*"))  # the log of the one nobody took is gone too
