"""One container of a pod on a simulated node: start, watch, stop, report.

Two kinds, decided by the container spec alone:

- **process**: the spec has ``command`` or ``args``; they run for real in a
  sandbox (:mod:`gpulab.runtime.sandbox`); output becomes the container log,
  the exit code its termination state.
- **built-in program**: the image is one registered in
  :mod:`gpulab.runtime.programs` (the GPU stack's images); its program runs
  in the node agent for this container's node.
- **image entrypoint**: no ``command``, and an image whose program gpulab has
  (:mod:`gpulab.runtime.images`: CoreDNS, agnhost, nginx, busybox, python): its entrypoint runs as a
  process; where the host lacks that program the container waits, and an event says what to install.
- **simulated**: no ``command``/``args`` and any other image (its entrypoint
  would run, and there are no images here): the container is Running until
  stopped.
  The annotation ``gpulab.io/model-load-seconds`` (or
  ``gpulab.io/model-load-seconds.<container>``) says how long its "model"
  takes to load; its HTTP, TCP and gRPC probes, with nothing listening to
  dial, fail until then. Those of the other kinds dial the pod over the pod
  network, as the kubelet's prober does (:mod:`gpulab.runtime.probes`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from . import logs, programs, sandbox
from .images import ImageCatalog
from .shim import ShimHandle

LOAD_ANNOTATION = "gpulab.io/model-load-seconds"
# A container may not run longer than this on a 2-core teaching machine;
# override with GPULAB_CONTAINER_MAX_SECONDS.
DEFAULT_MAX_SECONDS = 3600
DEFAULT_MEMORY_CAP = 2 << 30
# The message of a container whose process vanished with no exit status (its shim was killed).
LOST = "the container's process was lost when gpulab's node agent restarted"
# What the node agent writes before it stops containers because it is stopping itself.
NODE_SHUTDOWN = "node-shutdown"


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def load_seconds(pod: dict[str, Any], container: str) -> float:
    ann = pod["metadata"].get("annotations") or {}
    raw = ann.get(f"{LOAD_ANNOTATION}.{container}", ann.get(LOAD_ANNOTATION, "0"))
    try:
        return max(0.0, float(str(raw).rstrip("s")))
    except ValueError:
        return 0.0


@dataclasses.dataclass
class Termination:
    exit_code: int
    reason: str
    started_at: float
    finished_at: float
    message: str = ""
    signal: int | None = None

    def to_api(self, container_id: str) -> dict[str, Any]:
        d: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
            "containerID": container_id,
        }
        if self.message:
            d["message"] = self.message
        if self.signal:
            d["signal"] = self.signal
        return d


class Container:
    """Runtime state of one container (init or regular) across its restarts."""

    def __init__(self, spec: dict[str, Any], pod: dict[str, Any], pod_dir: Path, init: bool,
                 images: ImageCatalog | None = None):
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.sidecar = init and spec.get("restartPolicy") == "Always"
        self.pod_dir = pod_dir
        self.factory = programs.lookup(spec.get("image", ""))
        # The image's own program, where gpulab has it (CoreDNS's): its entrypoint runs for real.
        self.entrypoint = images.lookup(spec.get("image", "")) if images and self.factory is None else None
        self.simulated = (self.factory is None and self.entrypoint is None
                          and not spec.get("command") and not spec.get("args"))
        self.program: programs.Program | None = None
        self.load_seconds = load_seconds(pod, self.name)
        self.restart_count = 0
        self.state = "waiting"
        self.waiting_reason = "PodInitializing"
        self.waiting_message = ""
        self.started_at: float | None = None
        self.termination: Termination | None = None
        self.last_termination: Termination | None = None
        self.shim: ShimHandle | None = None
        self.log: logs.LogWriter | None = None
        self.ready = False
        self.started = False  # startup probe passed (or none)
        self.next_start = 0.0
        self.backoff = 0.0
        self.kill_reason: tuple[str, str] | None = None
        self.deadline: float | None = None
        self.prober: Any = None  # probes.Prober while running
        self.pull: Any = None  # imagemanager.Pull while its image is being pulled, before it is created

    # -- identity ------------------------------------------------------------

    def _container_id(self, restart: int) -> str:
        h = hashlib.sha256(f"{self.pod_dir}/{self.name}/{restart}".encode()).hexdigest()
        return f"gpulab://{h}"

    @property
    def container_id(self) -> str:
        return self._container_id(self.restart_count)

    @property
    def image_id(self) -> str:
        image = self.spec.get("image", "")
        digest = hashlib.sha256(image.encode()).hexdigest()
        return f"{image.split('@')[0].split(':')[0]}@sha256:{digest}"

    def log_path(self, restart: int | None = None) -> Path:
        n = self.restart_count if restart is None else restart
        return self.pod_dir / "logs" / self.name / f"{n}.log"

    def previous_log_path(self) -> Path | None:
        return self.log_path(self.restart_count - 1) if self.restart_count else None

    def run_dir(self, restart: int | None = None) -> Path:
        n = self.restart_count if restart is None else restart
        return self.pod_dir / "run" / f"{self.name}-{n}"

    # -- lifecycle -----------------------------------------------------------

    def _begin(self, started_at: float) -> None:
        self.state = "running"
        self.started_at = started_at
        self.termination = None
        self.kill_reason = None
        max_seconds = float(os.environ.get("GPULAB_CONTAINER_MAX_SECONDS", DEFAULT_MAX_SECONDS))
        self.deadline = started_at + max_seconds

    def start(self, argv: list[str], env: dict[str, str], mounts: list[sandbox.Mount],
              devices: list[sandbox.Mount], limits: dict[str, Any], uid: int | None, gid: int | None,
              hostname: str, program_ctx: programs.ProgramContext | None = None,
              join_pid: int | None = None) -> None:
        self._begin(time.time())
        self.ready = False
        self.started = "startupProbe" not in self.spec
        if self.factory is not None and program_ctx is not None:
            self.run_program(program_ctx)
            return
        if self.simulated:
            self.log = logs.LogWriter(self.log_path())
            return
        run_dir = self.run_dir()
        spec = sandbox.SandboxSpec(
            argv=argv, env=env, rootfs=run_dir / "rootfs", workdir=self.spec.get("workingDir") or "/",
            hostname=hostname, mounts=mounts, devices=devices, uid=uid, gid=gid,
            memory_bytes=limits.get("memory_bytes") or DEFAULT_MEMORY_CAP,
            cpu_seconds=limits.get("cpu_seconds"),
            file_bytes=limits.get("file_bytes"), join_pid=join_pid,
        )
        # The shim, not this process, owns the container's process and its log:
        # both outlive a restart of the node agent, as under a real kubelet.
        self.shim = ShimHandle.start(spec, run_dir, self.log_path())  # ShimError: the pod worker retries
        self.started_at = self.shim.started_at or self.started_at

    def run_program(self, program_ctx: programs.ProgramContext) -> None:
        """Run the container's built-in program (at start, or again after a node-agent restart)."""
        self.log = logs.LogWriter(self.log_path())
        writer = self.log
        program_ctx.log = lambda stream, text: writer.write_line(stream, text.encode(errors="replace"))
        self.program = self.factory(program_ctx)  # type: ignore[misc]
        self.program.start()

    # -- adoption after a node-agent restart ---------------------------------------

    def adopt_running(self, started_at: float) -> bool:
        """Take over this run after a restart of the node agent; False when its process is gone.

        Simulated containers have no process and simply carry on. A process
        is found through its shim; a built-in program (a thread of the agent
        that died) is resumed by :meth:`run_program` once the pod's
        volumes are ready, without counting a restart: on a real node the
        container never stopped.
        """
        self._begin(started_at)
        if self.simulated:
            self.log = logs.LogWriter(self.log_path())
            return True
        if self.factory is not None:
            return True
        handle = ShimHandle.find(self.run_dir())
        if handle is None:
            self.termination = Termination(137, "Error", started_at, time.time(), LOST)
            self.state = "terminated"
            return False
        self.shim = handle
        if handle.stop_reason() == NODE_SHUTDOWN:
            # Stopped with the node (``gpulab down``), not crashed: like a reboot.
            status = handle.exit_status() or {}
            self.shim = None
            self.termination = Termination(137, "Error", started_at, status.get("finished_at") or time.time(), LOST)
            self.state = "terminated"
            return False
        return True

    @property
    def needs_resume(self) -> bool:
        return self.state == "running" and self.factory is not None and self.program is None

    # -- watching --------------------------------------------------------------------

    def poll(self) -> Termination | None:
        """Notice that the process exited (or overran its wall-clock limit)."""
        if self.state != "running":
            return None
        if self.program is not None:
            rc = self.program.poll()
            if rc is not None:
                self._finish(rc)
            return self.termination
        if self.shim is None:
            if self.deadline and time.time() > self.deadline:
                self.stop(grace=0, reason=("DeadlineExceeded", "container ran past gpulab's wall-clock limit"))
                return self.termination
            return None
        status = self.shim.exit_status()
        if status is not None:
            self._finish(status["returncode"], status.get("finished_at"))
            return self.termination
        if self.shim.lost():
            self.kill_reason = ("Error", LOST)
            self._finish(137)
            return self.termination
        if self.deadline and time.time() > self.deadline:
            self.stop(grace=2, reason=("DeadlineExceeded", "container ran past gpulab's wall-clock limit"))
            return self.termination
        return None

    def _finish(self, rc: int, finished_at: float | None = None) -> None:
        if self.log:
            self.log.close()
            self.log = None
        sig = None
        if rc < 0:
            sig = -rc
            rc = 128 + sig
        reason = "Completed" if rc == 0 else "Error"
        message = self.kill_reason[1] if self.kill_reason else ""
        if self.kill_reason and self.kill_reason[0] == "DeadlineExceeded":
            reason = "DeadlineExceeded"
        self.termination = Termination(rc, reason, self.started_at or time.time(), finished_at or time.time(),
                                       message, sig)
        self.state = "terminated"
        self.ready = False
        self.shim = None
        self.program = None

    def kill(self, exit_code: int, lines: list[str]) -> None:
        """End the container as its own process failing would: last words on stderr, then ``exit_code``."""
        if self.state != "running":
            return
        if self.shim is not None:
            self.shim.signal(signal.SIGKILL)
            if self.shim.wait(5) is None:
                self.shim.kill_shim()
        elif self.program is not None:
            self.program.stop(0)
        if lines:
            writer = self.log or logs.LogWriter(self.log_path())
            for line in lines:
                writer.write_line("stderr", line.encode(errors="replace"))
            if writer is not self.log:
                writer.close()
        self.kill_reason = None
        self._finish(exit_code)

    def stop(self, grace: float, reason: tuple[str, str] | None = None, why: str = "") -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds, as a kubelet kills a container.

        ``why`` (say :data:`NODE_SHUTDOWN`) is left for a later node agent to read.
        """
        if self.state != "running":
            return
        self.kill_reason = reason
        if self.program is not None:
            self._finish(self.program.stop(grace))
            return
        if self.shim is None:
            # A simulated container (or a program not resumed yet) dies of the signal it was sent.
            rc = 137 if grace == 0 else 143
            if self.log:
                self.log.close()
                self.log = None
            msg = reason[1] if reason else ""
            why_ = reason[0] if reason and reason[0] == "DeadlineExceeded" else "Error"
            self.termination = Termination(rc, why_, self.started_at or time.time(), time.time(), msg)
            self.state = "terminated"
            self.ready = False
            return
        status = self.shim.stop(grace, why)
        if status is None:
            self._finish(137)
        else:
            self._finish(status["returncode"], status.get("finished_at"))

    def mark_restart(self, now: float) -> None:
        """Terminated → waiting; remembers the last run as ``lastState``."""
        self.last_termination = self.termination
        self.termination = None
        self.restart_count += 1
        self.state = "waiting"
        self.started = False

    # -- status --------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": self.image_id if self.started_at else "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.state == "running" and self.started,
        }
        if self.started_at:
            st["containerID"] = self.container_id
        if self.state == "running":
            st["state"] = {"running": {"startedAt": rfc3339(self.started_at or time.time())}}
        elif self.state == "terminated" and self.termination:
            st["state"] = {"terminated": self.termination.to_api(self.container_id)}
        else:
            w: dict[str, Any] = {"reason": self.waiting_reason}
            if self.waiting_message:
                w["message"] = self.waiting_message
            st["state"] = {"waiting": w}
        if self.last_termination:
            prev_id = self._container_id(self.restart_count - 1)
            st["lastState"] = {"terminated": self.last_termination.to_api(prev_id)}
        else:
            st["lastState"] = {}
        return st
