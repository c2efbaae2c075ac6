"""Add-ons: what a platform team installs on a running cluster, installed the same way here.

An add-on is a directory of plain manifests, ``manifests/addons/<name>/``,
applied in file order the way ``kubectl apply -f`` (or a Helm chart) would,
then waited for: every Deployment available and every APIService it registers
answering. ``monitoring`` is Prometheus, kube-state-metrics and
prometheus-adapter, the metrics pipeline of the chapter's HPA section; lesson 07
installs it (``gpulab addon install monitoring``) as a team would install
kube-prometheus-stack, so lessons 00-06 run without its ~260 MiB.

The way back is the same apply: :func:`put_back` re-applies an installed
add-on whose configuration someone changed, and :func:`reconfigure` tells its
programs about a ConfigMap edited in place (a reload or a restart), as an
operator would after ``kubectl edit``.

On the embedded backend the add-on's images run programs gpulab builds
(:mod:`.binaries`; they are built after the core, by ``gpulab build``): an
install first builds what is missing, with progress. On kind the images are
pulled as on any cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .. import _poll, paths
from ..i18n import _
from ..kube import api
from .base import Say

MANAGER = "gpulab-addon"
#: On a Deployment of an add-on: the program reloads its config when told, at this URL (POST), e.g.
#: ``http://prometheus.monitoring.svc:9090/-/reload``; Deployments without it restart when their config changes.
RELOAD_ANNOTATION = "gpulab.io/config-reload"
#: What `kubectl rollout restart` sets on the pod template.
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
#: How long the mounted file may take to show a changed ConfigMap before a reload.
SYNC_TIMEOUT = 30.0
#: How long an install waits for its Deployments and APIServices.
READY_TIMEOUT = 180.0


class AddonError(RuntimeError):
    """An add-on could not be installed; the message says which and why."""


def root() -> Path:
    return paths.manifests() / "addons"


def names() -> list[str]:
    """The add-ons there are (directories of ``manifests/addons``)."""
    return sorted(p.name for p in root().iterdir() if p.is_dir())


def documents(name: str) -> list[dict[str, Any]]:
    """The add-on's objects, in file order; raises :class:`AddonError` for an unknown name."""
    if name not in names():
        raise AddonError(_("unknown add-on {name!r} (there are: {names})", name=name, names=", ".join(names())))
    docs: list[dict[str, Any]] = []
    for path in sorted((root() / name).glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _api_services(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "APIService"]


def installed(client: api.Client, name: str) -> bool:
    """Whether the add-on's Deployments exist (it was installed, ready or not)."""
    return all(client.get("Deployment", d["metadata"]["name"], d["metadata"]["namespace"]) is not None
               for d in documents(name) if d["kind"] == "Deployment")


def install(kubeconfig: Path, name: str, say: Say, timeout: float = READY_TIMEOUT) -> str:
    """Apply the add-on and wait until it serves; returns a one-line summary."""
    docs = documents(name)
    client = api.Client(kubeconfig)
    started = time.monotonic()
    for svc in _api_services(docs):
        # An APIService another server registered (with its own caBundle) is taken over whole, as
        # `kubectl replace` would: its fields must not mix with the add-on's.
        old = client.get("APIService", svc["metadata"]["name"])
        if old is not None and (old["spec"].get("service") or {}) != svc["spec"]["service"]:
            served_by = old["spec"].get("service") or {}
            say(_("APIService {service} is served by {namespace}/{name}; {addon} takes it over",
                  service=svc["metadata"]["name"], namespace=served_by.get("namespace"), name=served_by.get("name"),
                  addon=name))
            client.delete("APIService", svc["metadata"]["name"])
    _apply(client, kubeconfig, name, docs, say, started + timeout)
    return _("add-on {addon} installed in {seconds:.1f} s", addon=name, seconds=time.monotonic() - started)


def put_back(kubeconfig: Path, name: str, say: Say, tell: Iterable[str] = (),
             timeout: float = READY_TIMEOUT) -> list[str]:
    """An installed add-on as its manifests say, as :func:`install` leaves it (a ConfigMap someone changed
    is applied again and the programs reading it reload or restart); nothing when it is not installed.

    ``tell``: ConfigMaps (``namespace/name``) whose programs reload or restart even when the ConfigMap is as
    installed: someone may have changed it and changed it back without telling them, and a program that
    was never told still runs the other configuration. Returns the ConfigMaps that had other contents."""
    client = api.Client(kubeconfig)
    if not installed(client, name):
        return []
    return _apply(client, kubeconfig, name, documents(name), say, time.monotonic() + timeout, _keys(tell))


def configmaps(name: str) -> list[str]:
    """The add-on's ConfigMaps, ``namespace/name``."""
    return [f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in documents(name) if d["kind"] == "ConfigMap"]


def _keys(configmaps: Iterable[str]) -> set[tuple[str, str]]:
    return {(ns, cm) for ns, _sep, cm in (key.partition("/") for key in configmaps)}


def _apply(client: api.Client, kubeconfig: Path, name: str, docs: list[dict[str, Any]], say: Say,
           deadline: float, tell: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Apply the add-on's objects; tell the programs whose ConfigMaps had other contents (and those of
    ``tell``); wait until it serves."""
    desired = {(d["metadata"]["namespace"], d["metadata"]["name"]): _data(d) for d in docs if d["kind"] == "ConfigMap"}
    before = {key: _data(client.get("ConfigMap", key[1], key[0])) for key in desired}
    for doc in docs:
        client.apply(doc, manager=MANAGER)
    say(_("{addon}: applied {n} objects from {path}", addon=name, n=len(docs), path=root() / name))
    # A ConfigMap that existed with other contents: the programs reading it are told (reload or restart).
    changed = {key for key, data in desired.items() if before[key] is not None and before[key] != data}
    _tell_and_wait(client, kubeconfig, docs, changed | (tell & set(desired)), say, deadline)
    return [f"{ns}/{cm}" for ns, cm in sorted(changed)]


def reconfigure(kubeconfig: Path, name: str, configmaps: Iterable[str], say: Say,
                timeout: float = READY_TIMEOUT) -> None:
    """The add-on's ConfigMaps ``configmaps`` (``namespace/name``) were edited in place, as an operator edits
    one: the programs that mount them reload or restart, as :func:`install` tells them; wait until it serves."""
    client = api.Client(kubeconfig)
    _tell_and_wait(client, kubeconfig, documents(name), _keys(configmaps), say, time.monotonic() + timeout)


def _tell_and_wait(client: api.Client, kubeconfig: Path, docs: list[dict[str, Any]], changed: set[tuple[str, str]],
                   say: Say, deadline: float) -> None:
    """Tell the Deployments that mount a ``changed`` ConfigMap; wait until every Deployment and APIService serves."""
    for doc in docs:
        if doc["kind"] == "Deployment" and changed & _mounted(doc):
            _reconfigure(client, kubeconfig, doc, changed & _mounted(doc), say)
    for doc in docs:
        if doc["kind"] == "Deployment":
            _wait_deployment(client, doc["metadata"]["namespace"], doc["metadata"]["name"], say, deadline)
    for svc in _api_services(docs):
        _wait_api_service(client, svc["metadata"]["name"], say, deadline)


def delete(kubeconfig: Path, name: str, say: Say) -> str:
    """Delete the add-on's objects (its namespaces with everything in them); returns a one-line summary."""
    client = api.Client(kubeconfig)
    gone = 0
    for doc in reversed(documents(name)):
        md = doc["metadata"]
        gone += client.delete(doc["kind"], md["name"], md.get("namespace"))
    say(_("{addon}: deleted {n} objects", addon=name, n=gone))
    return _("add-on {addon} deleted", addon=name)


def _data(cm: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if cm is None else {"data": cm.get("data") or {}, "binaryData": cm.get("binaryData") or {}}


def _mounted(deployment: dict[str, Any]) -> set[tuple[str, str]]:
    """The ConfigMaps (namespace, name) the Deployment's pods mount."""
    ns = deployment["metadata"]["namespace"]
    return {(ns, v["configMap"]["name"]) for v in deployment["spec"]["template"]["spec"].get("volumes") or []
            if v.get("configMap")}


def _reconfigure(client: api.Client, kubeconfig: Path, deployment: dict[str, Any], configs: set[tuple[str, str]],
                 say: Say) -> None:
    """A ConfigMap the Deployment mounts changed: tell the program to reload (once its pods see the new file,
    as the kubelet syncs it) or, for a program that reads its config only at start, restart its pods."""
    md = deployment["metadata"]
    names = ", ".join(n for _ns, n in sorted(configs))
    url = (md.get("annotations") or {}).get(RELOAD_ANNOTATION)
    if not url:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        client.patch("Deployment", md["name"], {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}},
                     md["namespace"])
        say(_("configmap {configmaps} changed: restarting deployment {namespace}/{name}", configmaps=names,
              namespace=md["namespace"], name=md["name"]))
        return
    _wait_mounted(client, kubeconfig, deployment, configs)
    host, _slash, path = url.split("://", 1)[-1].partition("/")
    service, _colon, port = host.partition(":")
    svc_name, svc_ns = service.split(".")[0], (service.split(".") + [md["namespace"]])[1]
    client.request("POST", f"/api/v1/namespaces/{svc_ns}/services/{svc_name}:{port}/proxy/{path}")
    say(_("configmap {configmaps} changed: {namespace}/{name} reloaded its config (POST {url})", configmaps=names,
          namespace=md["namespace"], name=md["name"], url=url))


def _wait_mounted(client: api.Client, kubeconfig: Path, deployment: dict[str, Any], configs: set[tuple[str, str]]) -> None:
    """Until the Deployment's pod (the one `kubectl exec deploy/NAME` picks: the add-on's Deployments run one
    replica) reads the ConfigMaps' new contents at their mount paths, as an operator would check."""
    import subprocess

    md, spec = deployment["metadata"], deployment["spec"]["template"]["spec"]
    mounts = {(m["name"]): m["mountPath"] for c in spec["containers"][:1] for m in c.get("volumeMounts") or []}
    want: dict[str, str] = {}
    for v in spec.get("volumes") or []:
        if v.get("configMap") and (md["namespace"], v["configMap"]["name"]) in configs and v["name"] in mounts:
            cm = client.get("ConfigMap", v["configMap"]["name"], md["namespace"]) or {}
            for key, value in (cm.get("data") or {}).items():
                want[f"{mounts[v['name']].rstrip('/')}/{key}"] = value

    def synced() -> bool:
        for path, value in want.items():
            out = subprocess.run([paths.kubectl() or "kubectl", f"--kubeconfig={kubeconfig}", "-n", md["namespace"], "exec",
                                  f"deploy/{md['name']}", "--", "cat", path], capture_output=True, text=True,
                                 timeout=30)
            if out.returncode != 0 or out.stdout != value:
                return False
        return True

    _poll.until(synced, SYNC_TIMEOUT, lambda last: AddonError(_(
        "deployment {namespace}/{name} does not see its changed config after {seconds:g} s",
        namespace=md["namespace"], name=md["name"], seconds=SYNC_TIMEOUT)),
        interval=0.5, max_interval=2.0)


def _available(client: api.Client, namespace: str, name: str) -> bool:
    dep = client.get("Deployment", name, namespace) or {}
    status = dep.get("status") or {}
    return (status.get("observedGeneration") == dep.get("metadata", {}).get("generation")
            and status.get("updatedReplicas", 0) == status.get("replicas", -1) == status.get("readyReplicas", -2)
            and status.get("availableReplicas", 0) >= 1)


def _wait_deployment(client: api.Client, namespace: str, name: str, say: Say, deadline: float) -> None:
    started = time.monotonic()
    last = [started]

    def ready() -> bool:
        if _available(client, namespace, name):
            return True
        if time.monotonic() - last[0] > 10:
            last[0] = time.monotonic()
            say(_("waiting for deployment {namespace}/{name} ({seconds:.0f} s)", namespace=namespace, name=name,
                  seconds=time.monotonic() - started))
        return False

    def timed_out(last: object) -> AddonError:
        return AddonError(_("deployment {namespace}/{name} not available after {seconds:.0f} s; see "
                            "`kubectl -n {namespace} describe pods` and `kubectl -n {namespace} logs deploy/{name}`",
                            namespace=namespace, name=name, seconds=time.monotonic() - started))

    _poll.until(ready, max(1.0, deadline - time.monotonic()), timed_out, interval=0.25, max_interval=1.0)
    say(_("deployment {namespace}/{name} available ({seconds:.1f} s)", namespace=namespace, name=name,
          seconds=time.monotonic() - started))


def _wait_api_service(client: api.Client, name: str, say: Say, deadline: float) -> None:
    def available() -> bool:
        return api.condition_true(client.get("APIService", name), "Available")

    def timed_out(last: object) -> AddonError:
        why = (api.condition(client.get("APIService", name), "Available") or {}).get("message")
        return AddonError(_("APIService {name} not available: {why}", name=name, why=why or _("no status yet")))

    _poll.until(available, max(1.0, deadline - time.monotonic()), timed_out, interval=0.25, max_interval=1.0)
    say(_("APIService {name} available", name=name))
