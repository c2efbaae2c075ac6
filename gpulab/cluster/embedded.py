"""The embedded backend: a real control plane as local processes, nodes by KWOK.

Start order and why (:meth:`EmbeddedCluster._start_components`):

1. ``etcd`` — the only state; survives ``down``/``up``.
2. ``kube-apiserver``, and beside it ``node-agent``, gpulab's simulated
   kubelet, whose own start needs no apiserver (Python's imports, the pod
   network's namespace, ``kubectl exec``'s way in): it then waits for the
   apiserver to be ready. The node agent makes (or adopts) the nodes' shared
   network namespace, where the CNI plugins put every pod, relays the
   apiserver in as the ``kubernetes`` Service's endpoint and serves the
   apiserver's egress into it (``--egress-selector-config-file``: pod and
   Service proxies, logs, exec, aggregated APIs; :mod:`gpulab.runtime.network`);
   runs pods' containers, reports their status, provisions local volumes,
   serves each node's resource metrics.
3. As soon as the apiserver serves (about a second before it is ready: its
   post-start hooks still run), what acts as ``system:masters``: KWOK's CRDs
   (:func:`.nodes.install_crds` says why so early); gpulab registers what a
   kubelet would register (the Node objects of the topology) and installs the
   cluster's defaults (a default StorageClass); ``kwok`` — node heartbeats and
   leases, and the kubelet's HTTP API (``kubectl logs``/``exec``) for every
   simulated node.
4. Once the apiserver is ready: ``kube-controller-manager`` and
   ``kube-scheduler`` — unmodified, with leader election off (one replica; a
   stale lease would delay a restart); the scheduler with a configuration
   file of two profiles, Kubernetes' default and a bin-packing one
   (:mod:`.schedulerconfig`). Started earlier, kube-controller-manager exits:
   its RBAC roles come from one of the apiserver's post-start hooks.
   ``kube-proxy`` — Services, in nftables mode, inside the pod network
   (:mod:`.kubeproxy`), once the node agent has made it. ``metrics-server`` —
   the real one, behind the APIService ``v1beta1.metrics.k8s.io``
   (``kubectl top``; :mod:`.metricsserver`).
5. Once nodes are Ready, the NVIDIA GPU Operator and cluster DNS (CoreDNS,
   :mod:`.clusterdns`) are installed as their Helm chart and manifests would
   (:mod:`gpulab.fakegpu.operator`); their pods run on the nodes.

Without namespaces (``GPULAB_SANDBOX=process``) there is no pod network:
neither ``kube-proxy`` nor CoreDNS runs.

Everything listens on 127.0.0.1 only, on ports chosen free at first start
and reused afterwards so kubeconfigs stay valid.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

from .. import paths
from ..i18n import _, ngettext
from .._fsutil import hold_lock, remove_tree
from .base import ClusterError, Say
from .base import say_to_stderr as _say
from ..kube.names import API_ADDRESS, NODE_ANNOTATION, POD_CIDR, SERVICE_CIDR
from ..runtime import network, sandbox, shim, streaming
from ..runtime.resourcemetrics import SERVING_CERT as NODE_AGENT_SERVING_CERT
from . import binaries, clusterdns, kubeproxy, metricsserver, nodes, schedulerconfig
from . import status as status_mod
from ..kube import api, kubeconfig, pki
from .processes import Component, ProcessTable, Started, StartError, free_port, http_ok, https_ok, port_is_free, who_listens
from ..kube.statedir import StateDir
from ..kube.topology import Topology
from ..kube.topology import load as load_topology


#: kube-controller-manager's and kube-scheduler's client rates to the apiserver (``--kube-api-qps``,
#: ``--kube-api-burst``, defaults 20 and 30; the scheduler's are its configuration file's
#: ``clientConnection.qps``/``burst``): raised as operators of large clusters raise them, so that creating
#: pods and binding them is not held to 20 requests a second (bench/scale_bench.py, BENCHMARKS.md).
CLIENT_RATES = (100, 200)

# The components; `down` stops them in the reverse of this order, those after the apiserver together (the start
# order is the module's docstring's).
# kube-proxy runs only where pods get namespaces, in the pod network the node agent makes (not in
# GPULAB_SANDBOX=process: see components()).
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
              "node-agent", "metrics-server", "kube-proxy")
NETWORK_COMPONENTS = ("kube-proxy",)
# The components that serve /healthz with a certificate `up` issues (<name>-serving.crt in the PKI directory).
SERVED_WITH_CERT = ("kube-controller-manager", "kube-scheduler")
SERVING_SUFFIX = "-serving"


#: Where gpulab's own custom metrics adapter ran before the monitoring add-on took its place.
LEGACY_ADAPTER_NAMESPACE = "custom-metrics"


def drop_legacy_adapter(client: api.Client, say: Say) -> None:
    """Remove what gpulab's old built-in custom metrics adapter left in a cluster made before the add-on.

    Its APIServices point at a port nothing serves any more, and an unavailable APIService stalls API
    discovery and the deletion of every namespace. The add-on's own APIServices (``monitoring``) stay.
    """
    for version in ("v1beta1", "v1beta2"):
        name = f"{version}.custom.metrics.k8s.io"
        svc = client.get("APIService", name)
        if svc and ((svc.get("spec") or {}).get("service") or {}).get("namespace") == LEGACY_ADAPTER_NAMESPACE:
            client.delete("APIService", name)
    if client.get("Namespace", LEGACY_ADAPTER_NAMESPACE):
        client.delete("Namespace", LEGACY_ADAPTER_NAMESPACE)
        say(_("removed the old built-in custom metrics adapter (namespace custom-metrics); "
              "custom metrics come from `gpulab addon install monitoring` now"))


def components() -> tuple[str, ...]:
    """The components this machine's sandbox runs: without namespaces there is no pod network to proxy."""
    if sandbox.kind() == "namespaces":
        return COMPONENTS
    return tuple(c for c in COMPONENTS if c not in NETWORK_COMPONENTS)
# "resource-metrics" is served by the node agent (every node's /metrics/resource); "egress" by the node agent
# too, the way into the pod network for host programs that reach the nodes (metrics-server's HTTPS_PROXY).
PORTS = ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok",
         "resource-metrics", "metrics-server", "egress")



class EmbeddedCluster(StateDir):
    def __init__(self, root: Path | None = None, client_rates: tuple[int, int] | None = CLIENT_RATES):
        """``client_rates``: kube-controller-manager's and kube-scheduler's qps and burst to the apiserver;
        None leaves them at the components' defaults."""
        self.root = root or paths.cluster_dir()
        self.procs = ProcessTable(self.root)
        self.client_rates = client_rates

    def running(self) -> dict[str, int]:
        return {n: p for n, p in self.procs.running().items() if n in COMPONENTS}

    def is_up(self) -> bool:
        return set(self.running()) == set(components())

    # -- bring-up ------------------------------------------------------------

    def _make_reachable(self, say: Say) -> None:
        """Let pod processes reach the cluster directory and gpulab's Python.

        Run as root, the node agent starts container and exec processes as
        nobody (sandbox.NOBODY); `kubectl exec POD -- nvidia-smi` then runs
        <root>/bin/nvidia-smi with this interpreter. A private directory on the
        way (root's 0700 home, a mkdtemp directory) makes that fail with
        "permission denied". Only the search bit is added: nobody can pass
        through, not list.
        """
        if os.geteuid() != 0:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        for target in (self.root.resolve(), Path(sys.prefix).resolve()):
            for d in reversed((target, *target.parents)):
                mode = d.stat().st_mode
                if not mode & stat.S_IXOTH:
                    d.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
                    say(_("{directory}: added o+x (search only), so pod processes, which run as nobody, can reach "
                          "{target}", directory=d, target=target))

    def _exclusive(self, purpose: str, say: Say):
        """One command at a time changes this cluster: a second `gpulab up` (a notebook's setup
        while the server's start script still runs one) waits, and says so, instead of starting
        its own copies of the components."""
        return hold_lock(self.root.parent / f".{self.root.name}.lock", what="the cluster lock",
                         purpose=purpose, say=say)

    def up(self, topology_path: str | Path | None = None, say: Say = _say, timeout: float = 120) -> str:
        """Start the cluster (or whatever part of it is down). Returns a one-line summary."""
        with self._exclusive("gpulab up", say):
            return self._up(topology_path, say, timeout)

    def _up(self, topology_path: str | Path | None, say: Say, timeout: float) -> str:
        state = self.state()
        if topology_path is not None:
            topo = load_topology(topology_path)
            stored = state.get("topology")
            if stored and Path(stored).resolve() != topo.source.resolve():
                raise ClusterError(_(
                    "a cluster with topology {topology} already exists in {path}; "
                    "`gpulab reset --topology FILE` switches topologies (it wipes the cluster's objects), "
                    "or `gpulab down --purge` deletes it", topology=stored, path=paths.shown(self.root)))
        else:
            topo = load_topology(state.get("topology"))
        running = self.running()
        wanted = components()
        if set(running) == set(wanted):
            return _("cluster already running ({n} nodes); kubeconfig: {path}", n=len(topo.nodes),
                     path=paths.shown(self.kubeconfig))
        if "node-agent" not in running:
            # Before anything starts: pods need a sandbox, and this says why there is none and what to do.
            try:
                sandbox.check()
            except sandbox.SandboxUnavailable as e:
                raise ClusterError(str(e)) from None
        if "kube-proxy" in wanted and "kube-proxy" not in running and kubeproxy.nft_missing():
            raise ClusterError(str(kubeproxy.nft_missing()))
        if running:
            down = [c for c in wanted if c not in running]
            say(_("restarting stopped components: {components} (objects are kept)", components=", ".join(down)))

        bins = binaries.ensure(say, for_up=True)
        started = time.monotonic()
        self._make_reachable(say)
        pki.ensure(self.pki)
        # The nodes' kubelet endpoint for resource metrics: one for every node, so it names each node's address.
        pki.issue_server(self.pki, NODE_AGENT_SERVING_CERT, "gpulab:node-agent", (),
                         nodes.internal_ips(topo, sandbox.kind() == "namespaces"))
        for name in SERVED_WITH_CERT:
            pki.issue_server(self.pki, f"{name}{SERVING_SUFFIX}", name, ())
        ports = self._ports(state.get("ports", {}), running)
        state.update(topology=str(topo.source.resolve()), ports=ports, backend="embedded")
        self._save_state(state)
        self._write_kubeconfigs(ports["apiserver"])

        started_now: list[str] = []
        try:
            self._start_components(wanted, running, bins, ports, topo, say, started_now)
            nodes.wait_ready(self, topo, timeout=max(10.0, timeout - (time.monotonic() - started)))
            say(_("{n} nodes Ready after {seconds:.1f} s", n=len(topo.nodes), seconds=time.monotonic() - started))
            # Loaded here, at bring-up: every other command that reads the cluster spares the GPU stack's import.
            from ..fakegpu import operator as gpu_operator

            # The stack's pods live on across a restart of the node agent (it adopts
            # them), so their Ready conditions from before it still hold.
            # The caller's timeout bounds the whole bring-up; never less than the stack's own 90 s (a large
            # topology passes more: every node's operands must be up).
            gpu_operator.install(self.kubeconfig, say,
                                 timeout=max(90.0, timeout - (time.monotonic() - started)))
            drop_legacy_adapter(api.Client(self.kubeconfig), say)
            if "kube-proxy" in wanted:
                # After the GPU Operator: its pod is placed by the scheduler as on a cluster without DNS yet,
                # so where the lessons show it does not depend on where CoreDNS landed.
                clusterdns.install(self.kubeconfig)
                clusterdns.wait(self.kubeconfig, say)
        except BaseException as e:
            # Leave nothing half-started behind: what this call started, it stops. If that stops the
            # cluster (nothing of it runs any more), what outlives its components goes too, as in `down`:
            # the node agent made the pod network's namespace, whose holder outlives the node agent.
            try:
                for name in reversed(started_now):
                    self.procs.stop(name)
            finally:
                if not self.running():
                    self._stop_leftovers(say)
            if isinstance(e, StartError):
                raise ClusterError(str(e)) from None
            raise
        took = time.monotonic() - started
        return _("cluster up in {seconds:.1f} s: {n} nodes Ready ({gpu_nodes} with GPUs); kubeconfig: {path}",
                 seconds=took, n=len(topo.nodes), gpu_nodes=len(topo.gpu_nodes), path=paths.shown(self.kubeconfig))

    def _start_components(self, wanted: tuple[str, ...], running: dict[str, int], bins: binaries.Binaries,
                          ports: dict[str, int], topo: Topology, say: Say, started_now: list[str]) -> None:
        """Start what of ``wanted`` is not running (each name goes into ``started_now`` as it is spawned) and
        wait until all of it serves; the order is the module's."""
        spawned: dict[str, Started] = {}

        def start(*names: str) -> list[Started]:
            todo = [n for n in names if n in wanted and n not in running]
            if not todo:
                return []
            say(_("starting {components}", components=", ".join(todo)))
            if "metrics-server" in todo:
                # Its RBAC and APIService first (the port may have moved): it reads its
                # authentication config from kube-system as it starts.
                metricsserver.install(self.kubeconfig, self.pki, ports["metrics-server"])
            out = []
            for name in todo:
                comp = self._component(name, bins, ports, topo.nodes[0].name)
                spawned[name] = (comp, self.procs.spawn(comp))
                started_now.append(name)
                out.append(spawned[name])
            return out

        self.procs.wait_ready(start("etcd"), timeout=60)
        start("kube-apiserver", "node-agent")
        if "kube-apiserver" in spawned:
            nodes.install_crds(self, bins.kwok_crds, spawned["kube-apiserver"])
            nodes.bootstrap(self, topo, bins.kwok_crds, say)
        start("kwok")
        if "kube-apiserver" in spawned:
            self.procs.wait_ready([spawned["kube-apiserver"]], timeout=60)
        start("kube-controller-manager", "kube-scheduler")
        if "kube-proxy" in wanted and "kube-proxy" not in running and "node-agent" in spawned:
            self.procs.wait_for("the pod network's namespace", network.ClusterNetwork(self.root).available,
                                spawned["node-agent"], timeout=60)
        start("kube-proxy")
        start("metrics-server")
        self.procs.wait_ready([s for name, s in spawned.items() if name not in ("etcd", "kube-apiserver")],
                              timeout=60)

    def status(self) -> dict[str, Any]:
        """What `gpulab status` shows: every component up (its pid) or down, each node's GPUs."""
        return status_mod.collect(self, components())

    @staticmethod
    def render_status(data: dict[str, Any]) -> str:
        return status_mod.render(data)

    def _ports(self, previous: dict[str, int], running: dict[str, int]) -> dict[str, int]:
        owner = {"etcd-client": "etcd", "etcd-peer": "etcd", "apiserver": "kube-apiserver",
                 "controller-manager": "kube-controller-manager", "scheduler": "kube-scheduler",
                 "kwok": "kwok", "resource-metrics": "node-agent",
                 "metrics-server": "metrics-server", "egress": "node-agent"}
        ports: dict[str, int] = {}
        for key in PORTS:
            prev = previous.get(key)
            if prev and owner[key] in running:
                ports[key] = prev
            elif prev and port_is_free(prev):
                ports[key] = prev
            else:
                if prev:
                    # The apiserver port is in every kubeconfig; a moved port
                    # is worth telling about.
                    _say(_("port {port} ({purpose}) is held by {holder}; using another", port=prev, purpose=key,
                           holder=who_listens(prev)))
                # A port is taken only once its component listens: the kernel may hand out the same free
                # port twice meanwhile, so draw again until it is one this cluster has not got yet.
                port = free_port()
                for _attempt in range(50):
                    if port not in ports.values():
                        break
                    port = free_port()
                ports[key] = port
        if len(set(ports.values())) != len(ports):
            # (Two kept ports can still clash: a state file edited by hand.)
            raise ClusterError(f"port allocation collided: {ports}; run `gpulab up` again")
        return ports

    def _write_kubeconfigs(self, api_port: int) -> None:
        server = f"https://127.0.0.1:{api_port}"
        ca = self.pki / "ca.crt"
        kubeconfig.write(self.kubeconfig, server, ca, self.pki / "admin.crt", self.pki / "admin.key")
        for stem, cn, _key in pki.COMPONENTS:
            if stem == "admin":
                continue
            kubeconfig.write(self.root / "kubeconfigs" / f"{stem}.yaml", server, ca,
                             self.pki / f"{stem}.crt", self.pki / f"{stem}.key", user=cn)

    def _component(self, name: str, bins: binaries.Binaries, ports: dict[str, int], first_node: str) -> Component:
        p = self.pki
        kc = self.root / "kubeconfigs"
        admin = (p / "admin.crt", p / "admin.key")
        if name == "etcd":
            data = self.root / "etcd"
            client = f"http://127.0.0.1:{ports['etcd-client']}"
            peer = f"http://127.0.0.1:{ports['etcd-peer']}"
            return Component(name, [
                str(bins["etcd"]), "--name=gpulab", f"--data-dir={data}",
                f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=gpulab={peer}",
                # A teaching cluster trades durability on power loss for speed.
                "--unsafe-no-fsync=true", "--auto-compaction-retention=1",
                # One member, no peers to hear from: its election waits only for its own randomised timeout
                # (up to 2x --election-timeout, less the ticks etcd skips), which with the defaults (100 ms
                # ticks, 1 s) made it ready anywhere from 0.1 to 1 s after it started.
                "--heartbeat-interval=10", "--election-timeout=100",
                "--quota-backend-bytes=2147483648", "--log-level=warn",
            ], http_ok(f"{client}/health"))
        if name == "kube-apiserver":
            port = ports["apiserver"]
            return Component(name, [
                str(bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd-client']}",
                # Bound to the host's loopback; advertised (the `kubernetes` Service's endpoint) at its
                # address inside the pod network, where the pod network relays it (gpulab.runtime.network).
                "--bind-address=127.0.0.1", f"--advertise-address={API_ADDRESS}", f"--secure-port={port}",
                f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                # The default admission chain plus nothing else; ResourceQuota,
                # Priority and DefaultStorageClass are all in it.
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                # Aggregation layer (metrics-server's APIService; prometheus-adapter's
                # once the monitoring add-on is installed). Aggregator routing stays
                # off: it would dial Service endpoints, while an ExternalName Service
                # lets an extension server on 127.0.0.1 be reached the way kwokctl
                # reaches metrics-server.
                f"--requestheader-client-ca-file={p / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
                *self._egress_selector(),
                "--profiling=false", "--v=0",
            ], https_ok(f"https://127.0.0.1:{port}/readyz", p / "ca.crt", admin))
        if name == "kube-controller-manager":
            return Component(name, [
                str(bins[name]), *self._client_flags(name, ports["controller-manager"]),
                "--use-service-account-credentials=true",
                f"--root-ca-file={p / 'ca.crt'}", f"--service-account-private-key-file={p / 'sa.key'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}", f"--cluster-signing-key-file={p / 'ca.key'}",
                "--allocate-node-cidrs=true", f"--cluster-cidr={POD_CIDR}", "--node-cidr-mask-size=24",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Lessons watch an HPA react; the default 15 s period makes
                # each step of a demo wait needlessly.
                "--horizontal-pod-autoscaler-sync-period=5s",
                "--horizontal-pod-autoscaler-downscale-stabilization=30s",
            ], https_ok(f"https://127.0.0.1:{ports['controller-manager']}/healthz"))
        if name == "kube-scheduler":
            # Its client, leader election and profiles are in its configuration file (schedulerconfig).
            qps, burst = self.client_rates or (None, None)
            config = schedulerconfig.write(self.root / "kube-scheduler.yaml", kc / f"{name}.yaml",
                                           qps=qps, burst=burst, leader_elect=False)
            return Component(name, [str(bins[name]), f"--config={config}",
                                    *self._serving_flags(name, ports["scheduler"]), "--v=0"],
                             https_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz"))
        if name == "kwok":
            port = ports["kwok"]
            config = self.root / "kwok.yaml"
            shutil.copyfile(Path(__file__).with_name("kwok-stages.yaml"), config)
            return Component(name, [
                str(bins["kwok"]), f"--kubeconfig={kc / 'kwok.yaml'}", f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION[0]}={NODE_ANNOTATION[1]}",
                "--manage-nodes-with-label-selector=", "--manage-single-node=",
                "--node-ip=127.0.0.1", "--node-name=localhost", f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={p / 'kwok.crt'}", f"--tls-private-key-file={p / 'kwok.key'}",
                "--node-lease-duration-seconds=40", "--enable-crds=ClusterLogs,ClusterExec,ClusterPortForward",
                f"--cidr={POD_CIDR}",
            ], https_ok(f"https://127.0.0.1:{port}/healthz"),
                # kwok resolves `kubectl exec` commands on its own PATH: first the links that run them in
                # the container (runtime/streaming.py), nvidia-smi among them.
                env=dict(os.environ, KWOK_WORKDIR=str(self.root / "kwok-work"),
                         PATH=f"{self.root / streaming.FARM}:{os.environ.get('PATH', '')}"))
        if name == "node-agent":
            ready = self.root / "node-agent.ready"
            ready.unlink(missing_ok=True)
            return Component(name, [
                sys.executable, "-m", "gpulab.cluster.nodeagent", f"--cluster-dir={self.root}",
                f"--cni-bin={bins.cni_bin_dir}", f"--coredns={bins['coredns']}", f"--agnhost={bins['agnhost']}",
                *(f"--{image}={bins[image]}" for image in ("prometheus", "prometheus-adapter", "kube-state-metrics")),
                f"--apiserver-port={ports['apiserver']}",
            ], ready.exists, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        if name == "kube-proxy":
            holder = network.ClusterNetwork(self.root).holder()
            if holder is None:
                raise ClusterError("kube-proxy cannot start: the pod network's namespace is gone "
                                   "(`gpulab down` then `gpulab up` makes a new one)")
            config = kubeproxy.config(self.root, first_node)
            return Component(name, kubeproxy.argv(bins["kube-proxy"], holder, config),
                             lambda: kubeproxy.ready(self.root), argv0=str(bins["kube-proxy"]),
                             env=dict(os.environ, PATH=f"{os.environ.get('PATH', '')}:{network.TOOL_PATH}"))
        if name == "metrics-server":
            port = ports["metrics-server"]
            # With a pod network the nodes' addresses are there: it reaches them through the node agent's
            # egress, as a proxy (the apiserver, on 127.0.0.1, is never proxied).
            egress = ports["egress"] if sandbox.kind() == "namespaces" else None
            return Component(name, metricsserver.argv(bins["metrics-server"], self.root, port,
                                                      ports["resource-metrics"]),
                             https_ok(f"https://127.0.0.1:{port}/livez", p / "ca.crt", admin),
                             env=dict(os.environ, **metricsserver.proxy_env(egress)))
        raise KeyError(name)

    def _egress_selector(self) -> list[str]:
        """kube-apiserver's way into the pod network, where it has one (not in GPULAB_SANDBOX=process).

        The apiserver is a host process and the pod network gpulab's own namespace: everything it dials in
        the cluster (the egress selection ``cluster``: ``pods/proxy`` and ``services/proxy``, the kubelet
        API for logs, exec and port-forward, aggregated APIs, webhooks) goes as HTTP CONNECT over the node
        agent's unix socket (:class:`gpulab.runtime.network.EgressProxy`), which dials pod and Service
        addresses inside the network and ``localhost`` on the host. The socket comes with the node agent:
        the apiserver starts and serves without it, and those requests fail until it is there.
        """
        if sandbox.kind() != "namespaces":
            return []
        uds = network.ClusterNetwork(self.root).dir / network.EGRESS_SOCKET
        config = self.root / "egress-selector.yaml"
        config.write_text("apiVersion: apiserver.k8s.io/v1beta1\n"
                          "kind: EgressSelectorConfiguration\n"
                          "egressSelections:\n"
                          "- name: cluster\n"
                          "  connection:\n"
                          "    proxyProtocol: HTTPConnect\n"
                          "    transport:\n"
                          "      uds:\n"
                          f"        udsName: {json.dumps(str(uds))}\n")
        return [f"--egress-selector-config-file={config}"]

    def _serving_flags(self, name: str, port: int) -> list[str]:
        """Flags kube-controller-manager and kube-scheduler share: where each serves /healthz, and how it
        checks who asks."""
        kubeconfig = self.root / "kubeconfigs" / f"{name}.yaml"
        # A serving certificate of the cluster's CA (`up` issues it, an ECDSA key): without one each makes a
        # self-signed RSA one as it starts, a tenth of a second or more of its start on 2 cores.
        stem = self.pki / f"{name}{SERVING_SUFFIX}"
        return [
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={stem}.crt", f"--tls-private-key-file={stem}.key",
        ]

    def _client_flags(self, name: str, port: int) -> list[str]:
        """kube-controller-manager's client flags (kube-scheduler has the same in its configuration file)."""
        return [
            f"--kubeconfig={self.root / 'kubeconfigs' / f'{name}.yaml'}", *self._serving_flags(name, port),
            # One replica: a lease left by the previous run would only delay the restart.
            "--leader-elect=false",
            *([f"--kube-api-qps={self.client_rates[0]}", f"--kube-api-burst={self.client_rates[1]}"]
              if self.client_rates else []),
            "--v=0",
        ]

    # -- stop / reset / purge -------------------------------------------------

    def down(self, purge: bool = False, say: Say = _say) -> str:
        with self._exclusive("gpulab down", say):
            return self._down(purge, say)

    def _down(self, purge: bool, say: Say) -> str:
        try:
            # Whatever talks to the apiserver stops together (the node agent's pods take their 2 s grace while
            # metrics-server drains), then the apiserver, then etcd: one by one, `down` took the sum, 4.7 s.
            stopped = self.procs.stop_all(reversed(COMPONENTS[2:]))
            stopped += [n for n in reversed(COMPONENTS[:2]) if self.procs.stop(n)]
            # Anything else recorded (an old component name) goes too.
            for extra in self.procs.running():
                self.procs.stop(extra)
        finally:
            # Also when stopping a component failed or was interrupted (Ctrl-C, a test run's SIGTERM).
            self._stop_leftovers(say)
        if purge:
            from ..fakegpu.node import remove_socket_dirs  # the GPU stack's import, for a purge only

            remove_socket_dirs(self.root)
            remove_tree(self.root)
            return _("cluster stopped and deleted ({path})", path=paths.shown(self.root))
        if not stopped:
            return _("no cluster processes were running")
        return _("stopped {components}; state kept in {path} (`gpulab up` resumes it)",
                 components=", ".join(stopped), path=paths.shown(self.root))

    def _stop_leftovers(self, say: Say) -> None:
        """Stop what outlives the cluster's components, once they are stopped: whatever stops the cluster
        (`down`, `reset`, a failed `up`) calls this."""
        try:
            # Containers outlive a killed node agent under their shims; with the node down, they stop.
            orphans = shim.stop_orphans(self.root / "pods")
            if orphans:
                say(ngettext("stopped {n} container left running by a node agent that died",
                             "stopped {n} containers left running by a node agent that died", orphans))
            network.stop_sandboxes(self.root)
        finally:
            # The pod network's namespace outlives a crash of the node agent that made it (its holder runs
            # in a session of its own); with the nodes down, it goes too.
            network.ClusterNetwork(self.root).stop_holder()

    def reset(self, topology_path: str | Path | None = None, say: Say = _say) -> str:
        with self._exclusive("gpulab reset", say):
            return self._reset(topology_path, say)

    def _reset(self, topology_path: str | Path | None, say: Say) -> str:
        """Back to the topology's initial state: objects, volumes and pod data are wiped."""
        topo = load_topology(topology_path if topology_path is not None else self.state().get("topology"))
        self._down(False, say)
        for sub in ("etcd", "nodes", "pods", "kwok-work"):
            remove_tree(self.root / sub)
        state = self.state()
        state["topology"] = str(topo.source.resolve())
        self._save_state(state)
        return self._up(None, say, 120)
