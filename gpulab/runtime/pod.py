"""The life of one pod on a simulated node, as a kubelet's pod worker lives it.

Per pod, one thread repeatedly *syncs*: it compares what the API says the pod
should be with what runs, acts (set up volumes, run init containers in order,
start containers, probe them, restart them with back-off, enforce
``activeDeadlineSeconds``, stop them on deletion) and reports the result as
the pod's status. The decisions that belong to controllers — retrying a
Job's pods, honouring ``backoffLimit``, replacing a Deployment's pods — stay
with the real kube-controller-manager, which sees only this status.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from kubernetes.utils import parse_quantity

from .._fsutil import remove_tree
from ..kube import api
from ..kube import events
from ..kube.names import KUBERNETES_SERVICE_IP
from . import dnsconfig, imagemanager, probes, programs, sandbox
from .devices import AdmissionError, AdmissionPending, DeviceHooks
from .containers import LOST, NODE_SHUTDOWN, Container, Termination, rfc3339
from .imagemanager import ImageManager
from .images import ImageCatalog
from .network import NetworkError, PodNetwork, PodSandbox
from .volumes import VolumeBuilder, VolumeError, field_value, resource_value

log = logging.getLogger("gpulab.runtime")

BACKOFF_INITIAL = 10.0
BACKOFF_MAX = 300.0
#: How often a pod worker looks at a pod while something about it can change at any moment: a container's process
#: may exit (its shim writes a file), an image is being pulled, a container is about to start. (A pod holding GPUs
#: is not among them: the device side wakes it when a neighbour's CUDA program ends one of its containers,
#: DeviceHooks.wake_with.)
BUSY_WAIT = 0.25
#: Pods of one node agent that sync at the same time (PodHost.sync_slots).
SYNC_SLOTS = 16
#: The longest a settled pod waits between looks: its containers are built-in programs (whose exit wakes the
#: worker) or simulated processes, or it has finished. Anything else that concerns it wakes the worker too (an
#: update from the API, its deletion, a ConfigMap it mounts), and a probe, restart or deadline due sooner shortens
#: the wait. A fleet's thousands of GPU-stack pods then cost nothing between events.
SETTLED_WAIT = 30.0
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
#: The pod conditions this node side writes (others, such as the scheduler's PodScheduled, are kept as found).
KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
#: How the kubelet's status message of a pod refused at admission begins.
REJECTED = "Pod was rejected: "


class ConfigError(Exception):
    """CreateContainerConfigError: the container's env or mounts cannot be built."""


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known variables are replaced, $$ escapes."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return VAR_REF.sub(sub, value)


class PodLogs(Protocol):
    """Where a pod's logs and exec targets are published for KWOK (:class:`gpulab.runtime.agent.LogRegistry`)."""

    def register(self, worker: PodWorker) -> None:
        """Publish (again) where the worker's containers log and how to exec into them."""

    def unregister(self, worker: PodWorker) -> None:
        """Withdraw what :meth:`register` published."""


class PodHost(Protocol):
    """What a :class:`PodWorker` needs of the node agent that runs it (:class:`gpulab.runtime.agent.NodeAgent`)."""

    cluster_dir: Path
    client: api.Client
    pods_dir: Path
    images: ImageCatalog
    image_manager: ImageManager
    volumes: VolumeBuilder
    devices: DeviceHooks
    network: PodNetwork
    logs: PodLogs
    # How many pods sync at once (SYNC_SLOTS): a fleet's hundreds of starting pods take turns instead of all
    # contending for the interpreter and the connections to the apiserver at once.
    sync_slots: threading.BoundedSemaphore


class PodWorker(threading.Thread):
    def __init__(self, agent: PodHost, pod: dict[str, Any]):
        md = pod["metadata"]
        super().__init__(daemon=True, name=f"pod-{md['namespace']}/{md['name']}")
        self.agent = agent
        self.client: api.Client = agent.client
        self.pod = pod
        self.key = (md["namespace"], md["name"], md["uid"])
        self.node = pod["spec"]["nodeName"]
        self.dir = agent.pods_dir / f"{md['namespace']}_{md['name']}_{md['uid']}"
        self.wake = threading.Event()
        self.gone = False
        self.stopping = False
        self.volumes: dict[str, Path] | None = None
        self.device_grants: dict[str, Any] = {}
        images = agent.images
        self.init = [Container(c, pod, self.dir, True, images) for c in pod["spec"].get("initContainers") or []]
        self.main = [Container(c, pod, self.dir, False, images) for c in pod["spec"].get("containers") or []]
        self.pod_ip: str | None = None
        self.net: PodSandbox | None = None  # the pod's sandbox on the pod network, once set up
        self.etc_mounts: list[sandbox.Mount] = []  # the kubelet's /etc/resolv.conf, hosts, hostname
        self.start_time: float | None = None
        self.terminal: str | None = None
        self.terminal_reason: tuple[str, str] | None = None
        self.pushed: dict[str, Any] | None = None
        self.initialized = not self.init
        self.admitted = False
        self.rejected = False  # refused at admission: never started, reported as the kubelet's rejectPod does
        self.adopted = False  # it ran under an earlier node agent
        self.devices_released = False
        self.last_event: dict[tuple[str, str], float] = {}
        self._adopt(pod)

    # -- entry points from the agent ----------------------------------------

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.wake.set()

    def remove(self) -> None:
        self.gone = True
        self.wake.set()

    def configmap_changed(self, name: str) -> None:
        """ConfigMap ``name`` of the pod's namespace changed: its volumes from it get the new contents."""
        if self.volumes is None or self.gone:
            return
        try:
            refreshed = self.agent.volumes.refresh(self.pod, self.dir, name)
        except (VolumeError, api.ApiError, OSError) as e:
            log.warning("refreshing configmap %s for pod %s failed: %s", name, self.pod["metadata"]["name"], e)
            return
        if refreshed:
            log.info("pod %s/%s: volumes %s updated from configmap %s", self.pod["metadata"]["namespace"],
                     self.pod["metadata"]["name"], ", ".join(refreshed), name)

    def shutdown(self) -> None:
        """The agent is stopping: stop processes, leave the API alone."""
        self.stopping = True
        self.wake.set()

    def run(self) -> None:
        while True:
            try:
                # A pod on its way out syncs at once (its grace period must not wait for a slot, nor hold one).
                leaving = self.stopping or self.gone or bool(self.pod["metadata"].get("deletionTimestamp"))
                with contextlib.nullcontext() if leaving else self.agent.sync_slots:
                    if self.sync():
                        return
                wait = self.next_wait(time.time())
            except Exception:  # a bug must not kill the node's other pods
                log.exception("sync of pod %s/%s failed", self.key[0], self.key[1])
                wait = 1.0
            self.wake.wait(wait)
            self.wake.clear()

    def next_wait(self, now: float) -> float:
        """Seconds until the next look at the pod, unless something wakes the worker first (see SETTLED_WAIT)."""
        if self.stopping or self.gone:
            return BUSY_WAIT
        if self.terminal:
            return SETTLED_WAIT
        if not (self.admitted and self.volumes is not None and self.initialized):
            return BUSY_WAIT
        due = now + SETTLED_WAIT
        deadline = self.pod["spec"].get("activeDeadlineSeconds")
        if deadline is not None and self.start_time is not None:
            due = min(due, self.start_time + float(deadline))
        for c in self.init + self.main:
            if c.state == "running":
                if c.shim is not None or c.needs_resume:
                    return BUSY_WAIT
                if c.simulated and c.deadline:
                    due = min(due, c.deadline)
                if c.prober is not None:
                    due = min([due, *(st.next_at for st in c.prober.states.values())])
            elif c.state == "waiting":
                if c.pull is not None or c.next_start <= now:
                    return BUSY_WAIT
                due = min(due, c.next_start)
            elif c.state == "terminated" and not (c.init and c.termination and c.termination.exit_code == 0):
                due = min(due, c.next_start)
        return min(SETTLED_WAIT, max(BUSY_WAIT, due - now))

    # -- adoption after a node-agent restart ----------------------------------

    def _adopt(self, pod: dict[str, Any]) -> None:
        """Pick up where an earlier node agent left this pod, as a restarted kubelet does.

        Containers keep running across the restart: simulated ones have no
        process, processes live on under their shims (:mod:`gpulab.runtime.shim`),
        built-in programs are resumed. Restart counts, start times and
        finished init containers are kept from the reported status. A pod
        that already ran is not admitted again: its devices come back from the
        device manager's checkpoint (:meth:`DeviceHooks.adopt`).
        """
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase in ("Succeeded", "Failed"):
            # Finished: keep what was reported, so that the status computed here matches it.
            self.terminal = phase
            self.pushed = status
            if status.get("reason"):
                self.terminal_reason = (status["reason"], status.get("message") or "")
            self.rejected = (phase == "Failed" and not status.get("containerStatuses")
                             and (status.get("message") or "").startswith(REJECTED))
            for c, cs in list(_pair(self.init, status.get("initContainerStatuses"))) + list(
                    _pair(self.main, status.get("containerStatuses"))):
                self._adopt_container(c, cs)
            self.initialized = True
            return
        if status.get("startTime"):
            self.start_time = _parse_time(status["startTime"])
        self.pod_ip = status.get("podIP")
        seen = False
        for c, cs in _pair(self.init, status.get("initContainerStatuses")):
            seen |= self._adopt_container(c, cs)
        for c, cs in _pair(self.main, status.get("containerStatuses")):
            seen |= self._adopt_container(c, cs)
        self.initialized = all(
            (c.sidecar and c.state == "running")
            or (c.state == "terminated" and c.termination is not None and c.termination.exit_code == 0)
            for c in self.init)
        self.adopted = seen

    def _adopt_container(self, c: Container, cs: dict[str, Any]) -> bool:
        """Restore one container from its reported status; True if it had started before."""
        c.restart_count = cs.get("restartCount", 0)
        state = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated")
        if last:
            c.last_termination = _termination(last)
        if "running" in state:
            started = _parse_time(state["running"]["startedAt"])
            c.started = cs.get("started", True)
            c.ready = cs.get("ready", False)
            if c.adopt_running(started):
                c.prober = probes.Prober(c.spec, started)
            return True
        if "terminated" in state:
            c.state = "terminated"
            c.termination = _termination(state["terminated"])
            c.started_at = c.termination.started_at
            return True
        if c.restart_count or last:
            # Waiting in a back-off: the kubelet's back-off lives in memory; a new one starts now.
            c.state = "waiting"
            c.waiting_reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
            return True
        return False

    # -- the sync loop -------------------------------------------------------

    def sync(self) -> bool:
        """One pass; True when the worker is finished with this pod."""
        pod = self.pod
        if self.stopping:
            self._kill_all(grace=2, why=NODE_SHUTDOWN)
            return True
        if self.gone:
            self._kill_all(grace=0)
            self._cleanup()
            return True
        if pod["metadata"].get("deletionTimestamp"):
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            # The preStop hooks run first and spend the grace period; SIGTERM gets what is left.
            self._kill_all(grace=self._pre_stop(float(grace)), reason=None, event=True)
            # As the kubelet does, a deleted pod reaches a terminal phase before it is let go:
            # Succeeded if every container exited 0, else Failed. The Job controller reads it,
            # with the DisruptionTarget condition of an evicted or preempted pod, for a podFailurePolicy.
            # Its devices are free by then (_push), before the API object is gone.
            if not self.terminal:
                exited_0 = all(c.termination is not None and c.termination.exit_code == 0 for c in self.main)
                self.terminal = "Succeeded" if self.main and exited_0 else "Failed"
            self._push()
            self._cleanup()
            self.client.delete("Pod", self.key[1], self.key[0], grace_seconds=0, uid=self.key[2])
            return True
        if self.terminal:
            self._push()
            return False
        now = time.time()
        if self.start_time is None:
            self.start_time = now
        if not self.admitted and not self._admit():
            self._push()
            return False
        if self.volumes is None and not self._setup():
            self._push()
            return False
        for c in self.init + self.main:
            if c.needs_resume:
                self._resume(c)
        deadline = pod["spec"].get("activeDeadlineSeconds")
        if deadline is not None and now - self.start_time > float(deadline):
            self._kill_all(grace=0)
            self._fail("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
            self._push()
            return False
        if not self.initialized:
            self._run_init(now)
        if self.initialized and not self.terminal:
            self._run_main(now)
        self._observe_devices()
        self._push()
        return False

    def _admit(self) -> bool:
        """The kubelet's admission: a pod's devices are allocated before any of it starts.

        A pod that was already running when the node agent restarted is not
        admitted again (a plugin that has not re-registered yet would refuse
        it); it keeps the devices the checkpoint records. A new pod whose
        device plugin is expected back waits, Pending, until it is.
        """

        if self.adopted:
            self.agent.devices.adopt(self.pod)
            self.admitted = True
            return True
        try:
            self.agent.devices.admit(self.pod)
        except AdmissionPending as e:
            self._event("WaitingForDevicePlugin", str(e), every=30)
            return False
        except AdmissionError as e:
            # The kubelet's rejectPod: a Warning event with the handler's message, and a Failed status
            # that holds only the phase, the reason and "Pod was rejected: <message>" (no containers:
            # none was ever created, so kubectl shows the reason as the pod's STATUS).
            self._event(e.reason, e.message, "Warning")
            self.terminal, self.terminal_reason, self.rejected = "Failed", (e.reason, REJECTED + e.message), True
            return False
        self.admitted = True
        return True

    def _observe_devices(self) -> None:
        # The GPUs see which containers run; one whose CUDA program fails
        # (out of GPU memory, a broken driver) ends as that program would.
        for c in self.init + self.main:
            kill = self.agent.devices.observe(self.pod, c.spec, c.state == "running")
            if kill is not None:
                c.kill(kill.exit_code, kill.lines)

    def _release_devices(self) -> None:
        # A finished pod keeps no devices, as the kubelet frees those of
        # terminated pods: the scheduler already counts them as free.
        if not self.devices_released:
            self.devices_released = True
            self.agent.devices.release(self.pod)

    def _setup(self) -> bool:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.volumes = self.agent.volumes.prepare(self.pod, self.dir)
        except VolumeError as e:
            self._event("FailedMount", str(e), "Warning", every=10)
            for c in self.init + self.main:
                c.waiting_reason = "ContainerCreating" if not c.init else "PodInitializing"
            if not e.retry:
                for c in self.init + self.main:
                    c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(e)
            return False
        if self.net is None or not self.net.alive():
            if not self.agent.network.ready_for(self.node):
                for c in self.init + self.main:
                    c.waiting_reason = "ContainerCreating" if not c.init else "PodInitializing"
                self.volumes = None
                return False  # the node has no podCIDR yet: its CNI config is not written
            processes = any(c.factory is None for c in self.init + self.main)
            try:
                self.net = self.agent.network.setup(self.pod, self.node, self.dir, processes=processes)
            except NetworkError as e:
                # The kubelet's words when the runtime cannot make the sandbox; it retries.
                self._event("FailedCreatePodSandBox", f"Failed to create pod sandbox: {e}", "Warning", every=10)
                for c in self.init + self.main:
                    c.waiting_reason = "ContainerCreating" if not c.init else "PodInitializing"
                self.volumes = None
                return False
            self.pod_ip = self.net.ip
            self.etc_mounts = dnsconfig.write(self.pod, self.pod_ip, self.dir)
        self.agent.logs.register(self)
        return True

    def _run_init(self, now: float) -> None:
        for c in self.init:
            if c.sidecar and c.state == "running":
                self._probe(c, now)
                continue
            if c.state == "terminated" and c.termination and c.termination.exit_code == 0 and not c.sidecar:
                continue
            if c.state == "running":
                term = c.poll()
                if term is None:
                    return
                if term.exit_code == 0:
                    continue
                if self.pod["spec"].get("restartPolicy", "Always") == "Never":
                    self._fail(None, None)
                    return
                self._schedule_restart(c, now)
                return
            if c.state == "terminated":
                # failed init container waiting for its back-off
                if self.pod["spec"].get("restartPolicy", "Always") == "Never":
                    return
                self._schedule_restart(c, now)
                return
            if now >= c.next_start:
                self._start(c)
                if c.sidecar and c.pull is None:
                    continue
            return
        self.initialized = True

    def _run_main(self, now: float) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        pulling = False  # the kubelet starts a pod's containers in order, each after its image is there
        for c in self.main:
            if c.state == "waiting" and now >= c.next_start and not pulling:
                self._start(c)
                pulling = c.pull is not None
            elif c.state == "running":
                if c.poll() is None:
                    self._probe(c, now)
            if c.state == "terminated":
                assert c.termination is not None
                if policy == "Always" or (policy == "OnFailure" and c.termination.exit_code != 0):
                    self._schedule_restart(c, now)
        if policy != "Always" and all(
            c.state == "terminated" and c.termination
            and (policy == "Never" or c.termination.exit_code == 0) for c in self.main
        ):
            failed = any(c.termination and c.termination.exit_code != 0 for c in self.main)
            for c in self.init:
                if c.sidecar:
                    c.stop(grace=2)
            if failed:
                self._fail(None, None)
            else:
                self.terminal = "Succeeded"

    # -- containers -----------------------------------------------------------

    def _image_ready(self, c: Container) -> bool:
        """The kubelet's ``EnsureImageExists`` before it creates ``c``: True once its image is on the node.

        A pull goes on while the pod worker syncs (its container waits in ContainerCreating, PodInitializing for
        an init container); :mod:`gpulab.runtime.imagemanager` decides, queues the pull and has the words.
        """
        if c.pull is not None:
            if not c.pull.done.is_set():
                return False
            pull, c.pull = c.pull, None
            self._event("Pulled", pull.pulled_message())
            return True
        image = c.spec.get("image", "")
        decision = self.agent.image_manager.ensure(self.node, image, c.spec.get("imagePullPolicy"))
        if decision.kind == "present":
            self._event("Pulled", decision.message)
            return True
        if decision.kind == "never":
            c.waiting_reason, c.waiting_message = "ErrImageNeverPull", decision.message
            self._event("ErrImageNeverPull", decision.message, "Warning")
            c.next_start = time.time() + imagemanager.NEVER_PULL_RETRY
            return False
        self._event("Pulling", decision.message)
        c.pull = decision.pull
        c.waiting_reason, c.waiting_message = ("PodInitializing" if c.init else "ContainerCreating"), ""
        return False

    def _start(self, c: Container) -> None:
        if not self._image_ready(c):
            return
        missing = c.entrypoint.missing() if c.entrypoint is not None and not c.spec.get("command") else None
        if missing:
            # The image's program is not on this machine: say what to install (never simulate it instead).
            c.waiting_reason = "CreateContainerError"
            c.waiting_message = f'image "{c.spec.get("image", "")}" cannot run: {missing}'
            self._event("Failed", f"Error: {c.waiting_message}", "Warning", every=30)
            c.next_start = time.time() + 10
            return
        # The image's own files (its program at its path, its config), under the pod's volumes as in a real image.
        image_mounts = c.entrypoint.mounts() if c.entrypoint is not None else []
        try:
            env = self._env(c)
            mounts = self.etc_mounts + image_mounts + self._mounts(c)
            grant = self.agent.devices.prepare(self.pod, c.spec)
        except (ConfigError, VolumeError) as e:
            c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(e)
            self._event("Failed", f"Error: {e}", "Warning", every=10)
            c.next_start = time.time() + 2
            return
        env.update(grant.env)
        mounts.extend(grant.mounts)
        command = c.spec.get("command") or []
        args = c.spec.get("args") or []
        if c.entrypoint is not None:
            # Its ENTRYPOINT and CMD unless the pod gives a command or args (as a runtime decides).
            command, args = c.entrypoint.command(command, args), []
        argv = [expand(a, env) for a in command + args]
        sc = {**(self.pod["spec"].get("securityContext") or {}), **(c.spec.get("securityContext") or {})}
        uid = sc.get("runAsUser")
        uid = sandbox.NOBODY if not uid else int(uid)
        gid = sc.get("runAsGroup")
        gid = uid if gid is None else int(gid)
        image = c.spec.get("image", "")
        self._event("Created", f"Created container: {c.name}")
        if c.simulated:
            # No process behind it: say so where a learner looks (kubectl describe pod).
            self._event("Simulated", f'gpulab has no program for image "{image}": container {c.name} is simulated '
                        "(Running, no process; probes follow gpulab.io/model-load-seconds). "
                        "Give it a command to run one.")
        ctx = self._program_context(c, env) if c.factory is not None else None
        try:
            c.start(argv, env, mounts, grant.devices, self._limits(c), uid, gid,
                    dnsconfig.hostname(self.pod), program_ctx=ctx, join_pid=self._join_pid())
        except (OSError, sandbox.SandboxUnavailable) as e:
            c.state = "waiting"
            c.waiting_reason, c.waiting_message = "RunContainerError", str(e)
            self._event("Failed", f"Error: {e}", "Warning", every=10)
            c.next_start = time.time() + 5
            return
        c.prober = probes.Prober(c.spec, c.started_at or time.time())
        if "readinessProbe" not in c.spec and c.started:
            c.ready = True
        self.agent.logs.register(self)
        self._event("Started", f"Started container {c.name}")

    def _program_context(self, c: Container, env: dict[str, str]) -> programs.ProgramContext:
        assert self.volumes is not None
        return programs.ProgramContext(self.agent.network, self.node, self.pod, c.spec, env, dict(self.volumes),
                                       log=lambda stream, text: None, pod_ip=self.pod_ip, exited=self.wake.set)

    def _resume(self, c: Container) -> None:
        """Run a built-in program again in its container after the node agent restarted."""
        try:
            env = self._env(c)
            env.update(self.agent.devices.prepare(self.pod, c.spec).env)
            c.run_program(self._program_context(c, env))
        except Exception as e:  # the program cannot come back: the container ends, its policy decides
            log.warning("cannot resume %s in %s/%s: %s", c.name, self.key[0], self.key[1], e)
            c.stop(grace=0, reason=("Error", LOST))

    def _schedule_restart(self, c: Container, now: float) -> None:
        if c.termination and c.termination.message == LOST:
            # Lost with the previous node agent, not crashed: a kubelet coming
            # back after a reboot starts such containers at once.
            c.mark_restart(now)
            c.next_start = now
            c.waiting_reason, c.waiting_message = "ContainerCreating", ""
            return
        c.backoff = BACKOFF_INITIAL if c.backoff == 0 else min(c.backoff * 2, BACKOFF_MAX)
        # A container that ran long enough before failing starts over at the
        # smallest back-off, as the kubelet resets it after 10 minutes.
        if c.termination and c.termination.finished_at - c.termination.started_at > 600:
            c.backoff = BACKOFF_INITIAL
        c.mark_restart(now)
        c.next_start = now + c.backoff
        c.waiting_reason = "CrashLoopBackOff"
        c.waiting_message = (f"back-off {int(c.backoff)}s restarting failed container={c.name} "
                             f"pod={self.key[1]}_{self.key[0]}({self.key[2]})")
        self._event("BackOff", "Back-off restarting failed container " f"{c.name} in pod "
                    f"{self.key[1]}_{self.key[0]}({self.key[2]})", "Warning")
        # `kubectl logs --previous` must find the run that just failed, during the back-off.
        self.agent.logs.register(self)

    def _probe(self, c: Container, now: float) -> None:
        prober = c.prober
        if prober is None or c.started_at is None:
            return
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            st = prober.due(kind, now, c.started)
            if st is None:
                continue
            result = probes.run_handler(st.spec, now - c.started_at, c.load_seconds,
                                        lambda cmd, t: self._exec(c, cmd, t),
                                        simulated=c.simulated, pod_ip=self.pod_ip,
                                        dial=self.agent.network.dial, container_ports=c.spec.get("ports") or [])
            crossed = prober.record(st, result, now)
            if result.warning:
                self._event("ProbeWarning", f"{probes.describe(kind)} probe warning: {result.output}", "Warning")
            if not result.ok:
                self._event("Unhealthy", f"{probes.describe(kind)} probe failed: {result.output}".rstrip(": "),
                            "Warning")
            if kind == "startupProbe" and crossed == "success":
                c.started = True
                if "readinessProbe" not in c.spec:
                    c.ready = True
            elif kind == "readinessProbe" and crossed:
                c.ready = crossed == "success"
            elif crossed == "failure" and kind in ("startupProbe", "livenessProbe"):
                what = "startup" if kind == "startupProbe" else "liveness"
                self._event("Killing", f"Container {c.name} failed {what} probe, will be restarted")
                grace = c.spec.get(kind, {}).get("terminationGracePeriodSeconds")
                if grace is None:
                    grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
                c.stop(grace=self._pre_stop(min(float(grace), 5.0), [c]))
                return

    def exec_spec(self, c: Container, argv: list[str], run: Path) -> sandbox.SandboxSpec:
        """A command in container ``c``'s sandbox, as a runtime execs one: its env, mounts, devices, user, network.

        Exec probes and ``kubectl exec`` (:mod:`gpulab.runtime.streaming`) both run through it.
        """
        env = self._env(c)
        grant = self.agent.devices.prepare(self.pod, c.spec)
        env.update(grant.env)
        image_mounts = c.entrypoint.mounts() if c.entrypoint is not None else []
        mounts = self.etc_mounts + image_mounts + self._mounts(c) + grant.mounts
        sc = {**(self.pod["spec"].get("securityContext") or {}), **(c.spec.get("securityContext") or {})}
        uid = int(sc["runAsUser"]) if sc.get("runAsUser") else sandbox.NOBODY
        gid = int(sc["runAsGroup"]) if sc.get("runAsGroup") is not None else uid
        return sandbox.SandboxSpec(argv=argv, env=env, rootfs=run / "rootfs", workdir=c.spec.get("workingDir") or "/",
                                   mounts=mounts, devices=grant.devices, uid=uid, gid=gid,
                                   hostname=dnsconfig.hostname(self.pod), join_pid=self._join_pid())

    def _exec(self, c: Container, cmd: list[str], timeout: float) -> tuple[int, str]:
        run = self.dir / "run" / f"{c.name}-probe"
        proc = sandbox.launch(self.exec_spec(c, cmd, run), run / "sandbox.json", subprocess.PIPE, subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        finally:
            remove_tree(run)
        return proc.returncode, out.decode(errors="replace")

    def _join_pid(self) -> int | None:
        """The process whose network namespace the pod's containers share (its sandbox), if it has one."""
        return self.net.sandbox_pid if self.net is not None else None

    def _pre_stop(self, grace: float, containers: list[Container] | None = None) -> float:
        """Run the running containers' ``lifecycle.preStop`` hooks, together, as the kubelet does before
        it sends SIGTERM; returns what is left of ``grace`` for the containers to stop in.

        A hook may take the whole grace period (then SIGTERM and, at once, SIGKILL follow). A failed hook
        is an event (``FailedPreStopHook``, the kubelet's text) and the container is stopped all the same.
        """
        began = time.monotonic()
        # Built-in programs (the GPU stack's operands) run inside the node agent: there is no process of
        # theirs to exec a hook in, and their own stop does what their images' hooks do.
        hooks = [(c, (c.spec.get("lifecycle") or {}).get("preStop"))
                 for c in (containers if containers is not None else self.main)
                 if c.state == "running" and c.factory is None]
        workers = [threading.Thread(target=self._run_hook, args=(c, hook, grace), daemon=True,
                                    name=f"prestop-{c.name}") for c, hook in hooks if hook]
        for w in workers:
            w.start()
        for w in workers:
            w.join(max(0.0, grace - (time.monotonic() - began)))
        return max(0.0, grace - (time.monotonic() - began))

    def _run_hook(self, c: Container, hook: dict[str, Any], budget: float) -> None:
        pod = f"{self.key[1]}_{self.key[0]}({self.key[2]})"  # the kubelet's format.Pod
        if "sleep" in hook:
            time.sleep(min(max(0.0, float((hook["sleep"] or {}).get("seconds") or 0)), budget))
            return
        if "exec" in hook:
            # The hook's time limit is the grace period: a hook has no timeoutSeconds of its own.
            cmd = [str(a) for a in (hook["exec"] or {}).get("command") or []]
            try:
                rc, out = self._exec(c, cmd, max(budget, 0.1))
                error = f"command '{' '.join(cmd)}' exited with {rc}: " if rc else ""
            except subprocess.TimeoutExpired:
                error, out = f"command '{' '.join(cmd)}' timed out", ""
            if error:
                self._event("FailedPreStopHook", f'Exec lifecycle hook ([{" ".join(cmd)}]) for Container "{c.name}" '
                            f'in Pod "{pod}" failed - error: {error}, message: "{out.strip()}"', "Warning")
            return
        if "httpGet" in hook and not c.simulated:
            spec = dict(hook, timeoutSeconds=max(1, int(budget)))
            result = probes.run_handler(spec, 0.0, 0.0, lambda cmd, t: (0, ""), simulated=False,
                                        pod_ip=self.pod_ip, dial=self.agent.network.dial,
                                        container_ports=c.spec.get("ports") or [])
            if not result.ok:
                path = (hook["httpGet"] or {}).get("path") or "/"
                self._event("FailedPreStopHook", f'HTTP lifecycle hook ({path}) for Container "{c.name}" in Pod '
                            f'"{pod}" failed - error: {result.output}', "Warning")

    def _kill_all(self, grace: float, reason: tuple[str, str] | None = None, event: bool = False,
                  why: str = "") -> None:
        for c in self.main + self.init:
            if c.state == "running":
                if event:
                    self._event("Killing", f"Stopping container {c.name}")
                c.stop(grace=grace, reason=reason, why=why)

    def _fail(self, reason: str | None, message: str | None) -> None:
        self.terminal = "Failed"
        if reason:
            self.terminal_reason = (reason, message or "")
            self._event(reason, message or "", "Warning")
        for c in self.main + self.init:
            if c.state == "running":
                c.stop(grace=0)

    def _cleanup(self) -> None:
        self.agent.devices.release(self.pod)
        self.agent.network.teardown(self.pod, self.node, self.dir)
        self.agent.logs.unregister(self)
        remove_tree(self.dir / "run")

    # -- building a container's process ----------------------------------------

    def _env(self, c: Container) -> dict[str, str]:
        ns = self.key[0]
        env: dict[str, str] = {
            "PATH": sandbox.DEFAULT_PATH,
            "HOSTNAME": self.pod["spec"].get("hostname") or self.key[1],
            "HOME": "/root" if (c.spec.get("securityContext") or {}).get("runAsUser") == 0 else "/tmp",
            "KUBERNETES_SERVICE_HOST": KUBERNETES_SERVICE_IP,
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443",
            "KUBERNETES_PORT": f"tcp://{KUBERNETES_SERVICE_IP}:443",
        }
        for src in c.spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            secret = "secretRef" in src
            ref = src.get("secretRef" if secret else "configMapRef") or {}
            data = self._source_data("Secret" if secret else "ConfigMap", ref, ns)
            env.update({prefix + k: v for k, v in data.items()})
        pod = dict(self.pod)
        pod["status"] = {**(self.pod.get("status") or {}), "podIP": self.pod_ip or "",
                         "hostIP": self.agent.network.node_address(self.node)}
        for var in c.spec.get("env") or []:
            name = var["name"]
            if "value" in var:
                env[name] = expand(str(var["value"]), env)
                continue
            vf = var.get("valueFrom") or {}
            if "fieldRef" in vf:
                env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                ref = dict(vf["resourceFieldRef"])
                ref.setdefault("containerName", c.name)
                env[name] = resource_value(pod, ref)
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                secret = "secretKeyRef" in vf
                ref = vf["secretKeyRef" if secret else "configMapKeyRef"]
                obj = self.client.get("Secret" if secret else "ConfigMap", ref.get("name", ""), ns)
                kind = "secret" if secret else "configmap"
                if obj is None or ref.get("key") not in (obj.get("data") or {}):
                    if ref.get("optional"):
                        continue
                    if obj is None:
                        raise ConfigError(f'{kind} "{ref.get("name")}" not found')
                    raise ConfigError(f'couldn\'t find key {ref.get("key")} in {kind.capitalize()} '
                                      f'{ns}/{ref.get("name")}')
                value = obj["data"][ref["key"]]
                if secret:
                    value = base64.b64decode(value).decode(errors="replace")
                env[name] = value
            else:
                env[name] = ""
        return env

    def _source_data(self, kind: str, ref: dict[str, Any], ns: str) -> dict[str, str]:
        """The data of an envFrom ConfigMap or Secret (decoded); {} if optional and absent."""
        obj = self.client.get(kind, ref.get("name", ""), ns)
        if obj is None:
            if ref.get("optional"):
                return {}
            raise ConfigError(f'{kind.lower()} "{ref.get("name")}" not found')
        data = obj.get("data") or {}
        if kind == "Secret":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        return dict(data)

    def _mounts(self, c: Container) -> list[sandbox.Mount]:
        assert self.volumes is not None
        out = []
        for vm in c.spec.get("volumeMounts") or []:
            host = self.volumes.get(vm["name"])
            if host is None:
                raise ConfigError(f'volume "{vm["name"]}" is not defined in the pod')
            if vm.get("subPath"):
                host = host / vm["subPath"]
                if not host.exists():
                    host.mkdir(parents=True)
                    host.chmod(0o777)
            out.append(sandbox.Mount(str(host), vm["mountPath"], bool(vm.get("readOnly"))))
        return out

    @staticmethod
    def _limits(c: Container) -> dict[str, Any]:
        limits = (c.spec.get("resources") or {}).get("limits") or {}
        out: dict[str, Any] = {}
        if "memory" in limits:
            out["memory_bytes"] = int(parse_quantity(limits["memory"]))
        if "cpu" in limits:
            # CPU seconds the container may use in all: its share of cores for
            # the longest time a container may run.
            out["cpu_seconds"] = max(1, int(float(parse_quantity(limits["cpu"])) * 3600))
        if "ephemeral-storage" in limits:
            out["file_bytes"] = int(parse_quantity(limits["ephemeral-storage"]))
        return out

    # -- status ---------------------------------------------------------------

    def _event(self, reason: str, message: str, type_: str = "Normal", every: float = 0) -> None:
        key = (reason, message)
        now = time.time()
        if every and now - self.last_event.get(key, 0) < every:
            return
        self.last_event[key] = now
        events.record(self.client, self.pod, reason, message, type_, component="kubelet", host=self.node)

    def status(self) -> dict[str, Any]:
        old = self.pod.get("status") or {}
        if self.rejected:
            rejected: dict[str, Any] = {
                "phase": "Failed", "startTime": rfc3339(self.start_time or time.time()),
                "conditions": [c for c in old.get("conditions") or [] if c.get("type") not in KUBELET_CONDITIONS]}
            rejected["reason"], rejected["message"] = self.terminal_reason or ("", "")
            if old.get("qosClass"):
                rejected["qosClass"] = old["qosClass"]
            return rejected
        now = rfc3339(time.time())
        containers = [c.status() for c in self.main]
        inits = [c.status() for c in self.init]
        if not self.initialized:
            for c, st in zip(self.main, containers):
                if c.state == "waiting" and c.waiting_reason not in ("CreateContainerConfigError",):
                    st["state"] = {"waiting": {"reason": "PodInitializing"}}
        elif self.volumes is None:
            for st in containers:
                if st["state"].get("waiting", {}).get("reason") in ("PodInitializing",):
                    st["state"] = {"waiting": {"reason": "ContainerCreating"}}
        all_ready = bool(self.main) and all(c.ready for c in self.main)
        phase = self.terminal or ("Running" if any(c.state != "waiting" or c.restart_count for c in self.main)
                                  and self.initialized else "Pending")
        if self.terminal:
            all_ready = False
        conditions = []
        for cond in old.get("conditions") or []:
            if cond.get("type") not in KUBELET_CONDITIONS:
                conditions.append(cond)
        prev = {c["type"]: c for c in old.get("conditions") or []}

        def cond(type_: str, ok: bool, reason: str | None = None) -> dict[str, Any]:
            status = "True" if ok else "False"
            p = prev.get(type_)
            d: dict[str, Any] = {"type": type_, "status": status, "lastProbeTime": None,
                                 "lastTransitionTime": p["lastTransitionTime"] if p and p.get("status") == status else now}
            if reason and not ok:
                d["reason"] = reason
            return d

        not_ready = "PodCompleted" if self.terminal else "ContainersNotReady"
        conditions += [
            cond("PodReadyToStartContainers", self.volumes is not None and not self.terminal),
            cond("Initialized", self.initialized, "PodCompleted" if self.terminal else "ContainersNotInitialized"),
            cond("Ready", all_ready, not_ready),
            cond("ContainersReady", all_ready, not_ready),
        ]
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.agent.network.node_address(self.node),
            "hostIPs": [{"ip": self.agent.network.node_address(self.node)}],
            "startTime": rfc3339(self.start_time or time.time()),
            "containerStatuses": containers,
        }
        if self.pod_ip:
            status["podIP"] = self.pod_ip
            status["podIPs"] = [{"ip": self.pod_ip}]
        if inits:
            status["initContainerStatuses"] = inits
        if old.get("qosClass"):
            status["qosClass"] = old["qosClass"]
        if self.terminal_reason:
            status["reason"], status["message"] = self.terminal_reason
        return status

    def _push(self) -> None:
        if self.terminal:
            # Devices are freed before anyone can see the pod finished: the scheduler counts them free
            # as soon as the phase is pushed and may bind the next pod to them at once, and the kubelet
            # admits that pod against its active pods only (a finished one holds nothing).
            self._release_devices()
        status = self.status()
        if status == self.pushed:
            return
        patch_status = dict(status)
        # Keys we own but no longer set must be removed (merge patch: null).
        for key in ("reason", "message", "podIP", "podIPs", "initContainerStatuses", "containerStatuses", "hostIP",
                    "hostIPs"):
            patch_status.setdefault(key, None)
        try:
            self.client.patch("Pod", self.key[1], {"status": patch_status}, self.key[0], subresource="status")
            self.pushed = status
        except api.NotFound:
            self.gone = True
        except api.ApiError as e:
            log.warning("status update of %s/%s failed: %s", self.key[0], self.key[1], e)


def _parse_time(s: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")))


def _termination(t: dict[str, Any]) -> Termination:
    """A Termination back from its API form (``state.terminated``)."""
    started = _parse_time(t["startedAt"]) if t.get("startedAt") else time.time()
    finished = _parse_time(t["finishedAt"]) if t.get("finishedAt") else started
    return Termination(t.get("exitCode", 0), t.get("reason") or "", started, finished, t.get("message") or "",
                       t.get("signal"))


def _pair(containers: list[Container], statuses: list[dict[str, Any]] | None):
    by_name = {s.get("name"): s for s in statuses or []}
    for c in containers:
        if c.name in by_name:
            yield c, by_name[c.name]
