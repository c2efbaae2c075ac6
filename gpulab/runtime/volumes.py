"""Volumes for pods on simulated nodes, materialised on the host.

Each simulated node has a host filesystem of its own under
``<cluster>/nodes/<node>/host/``: a ``hostPath: /data`` on ``gpu-node-1`` is
``nodes/gpu-node-1/host/data``, so two nodes never share a hostPath, as two
machines would not. Persistent volumes provisioned for a node live there
too (see :mod:`gpulab.runtime.provisioner`), which is why a checkpoint on a
PVC outlives the pod that wrote it and is found by the next one.
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from ..kube import api
from ..kube.informer import Informer

SUPPORTED = ("emptyDir", "hostPath", "configMap", "secret", "persistentVolumeClaim", "projected", "downwardAPI")


class VolumeError(Exception):
    """The volume cannot be set up (yet); the message goes into a FailedMount event."""

    def __init__(self, message: str, retry: bool = True):
        super().__init__(message)
        self.retry = retry


def node_host_path(nodes_dir: Path, node: str, path: str) -> Path:
    return nodes_dir / node / "host" / path.lstrip("/")


class VolumeBuilder:
    """Sets up a pod's volumes on its node. ConfigMaps come from ``configmaps`` (the node agent's shared watch,
    as the kubelet reads them from its watch-based cache) when it has them, else from the API."""

    def __init__(self, client: api.Client, nodes_dir: Path, configmaps: Informer | None = None):
        self.client = client
        self.nodes_dir = nodes_dir
        self.configmaps = configmaps

    def _get_configmap(self, name: str, namespace: str) -> dict[str, Any] | None:
        cached = self.configmaps.get(f"{namespace}/{name}") if self.configmaps is not None else None
        return cached if cached is not None else self.client.get("ConfigMap", name, namespace)

    def prepare(self, pod: dict[str, Any], pod_dir: Path) -> dict[str, Path]:
        """Set up every volume of ``pod``; returns volume name -> host path."""
        out: dict[str, Path] = {}
        for vol in pod["spec"].get("volumes") or []:
            name = vol["name"]
            kind = next((k for k in vol if k != "name"), None)
            if kind not in SUPPORTED:
                raise VolumeError(
                    f"volume {name!r}: type {kind!r} is not available on gpulab's simulated nodes "
                    f"(supported: {', '.join(SUPPORTED)})", retry=False)
            out[name] = getattr(self, "_" + kind)(pod, pod_dir, name, vol[kind] or {})
        return out

    def refresh(self, pod: dict[str, Any], pod_dir: Path, configmap: str) -> list[str]:
        """The kubelet's sync of a running pod's volumes after ConfigMap ``configmap`` changed: every volume
        of the pod made from it (a ``configMap`` volume, or a ``projected`` source) gets the new contents in
        place, so a container sees them at the same path (as a kubelet's atomic update does; a program that
        reads its config once must still be restarted or told to reload). Returns the volumes refreshed."""
        done: list[str] = []
        for vol in pod["spec"].get("volumes") or []:
            name = vol["name"]
            if (vol.get("configMap") or {}).get("name") == configmap:
                self._configMap(pod, pod_dir, name, vol["configMap"], in_place=True)
                done.append(name)
            elif any((s.get("configMap") or {}).get("name") == configmap
                     for s in (vol.get("projected") or {}).get("sources") or []):
                self._projected(pod, pod_dir, name, vol["projected"], in_place=True)
                done.append(name)
        return done

    # -- kinds ---------------------------------------------------------------

    def _emptyDir(self, pod, pod_dir, name, src) -> Path:
        d = pod_dir / "volumes" / "empty-dir" / name
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o777)  # as the kubelet creates emptyDir volumes
        return d

    def _hostPath(self, pod, pod_dir, name, src) -> Path:
        node = pod["spec"]["nodeName"]
        path = src.get("path", "")
        host = node_host_path(self.nodes_dir, node, path)
        kind = src.get("type") or ""
        if kind == "DirectoryOrCreate":
            if not host.exists():
                host.mkdir(parents=True)
                host.chmod(0o777)
        elif kind == "FileOrCreate":
            if not host.exists():
                host.parent.mkdir(parents=True, exist_ok=True)
                host.touch(0o666)
        elif kind in ("Directory", "File", "Socket", "CharDevice", "BlockDevice"):
            checks = {"Directory": host.is_dir, "File": host.is_file,
                      "Socket": lambda: host.exists() and stat.S_ISSOCK(host.stat().st_mode),
                      "CharDevice": lambda: host.exists() and stat.S_ISCHR(host.stat().st_mode),
                      "BlockDevice": lambda: host.exists() and stat.S_ISBLK(host.stat().st_mode)}
            if not checks[kind]():
                raise VolumeError(f"hostPath type check failed: {path} is not a {kind.lower()}")
        elif not host.exists():
            # An untyped hostPath that does not exist is created as a directory.
            host.mkdir(parents=True)
            host.chmod(0o777)
        return host

    def _configMap(self, pod, pod_dir, name, src, in_place: bool = False) -> Path:
        ns = pod["metadata"]["namespace"]
        cm = self._get_configmap(src.get("name", ""), ns)
        if cm is None:
            if src.get("optional"):
                return self._files(pod_dir, "configmap", name, {}, src, in_place)
            raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : configmap "{src.get("name")}" not found')
        data = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return self._files(pod_dir, "configmap", name, data, src, in_place)

    def _secret(self, pod, pod_dir, name, src) -> Path:
        ns = pod["metadata"]["namespace"]
        sec = self.client.get("Secret", src.get("secretName", ""), ns)
        if sec is None:
            if src.get("optional"):
                return self._files(pod_dir, "secret", name, {}, src)
            raise VolumeError(f'MountVolume.SetUp failed for volume "{name}" : secret "{src.get("secretName")}" not found')
        data = {k: base64.b64decode(v) for k, v in (sec.get("data") or {}).items()}
        return self._files(pod_dir, "secret", name, data, src)

    def _downwardAPI(self, pod, pod_dir, name, src) -> Path:
        data = {it["path"]: self._field(pod, it).encode() for it in src.get("items") or []}
        return self._files(pod_dir, "downward-api", name, data, {"defaultMode": src.get("defaultMode")})

    def _projected(self, pod, pod_dir, name, src, in_place: bool = False) -> Path:
        data: dict[str, bytes] = {}
        ns = pod["metadata"]["namespace"]
        for source in src.get("sources") or []:
            if "serviceAccountToken" in source:
                sat = source["serviceAccountToken"]
                data[sat.get("path", "token")] = self._token(pod, sat).encode()
            elif "configMap" in source:
                s = source["configMap"]
                cm = self._get_configmap(s.get("name", ""), ns)
                if cm is None and not s.get("optional"):
                    raise VolumeError(f'configmap "{s.get("name")}" not found')
                items = (cm or {}).get("data") or {}
                data.update(self._select(items, s.get("items"), lambda v: v.encode()))
            elif "secret" in source:
                s = source["secret"]
                sec = self.client.get("Secret", s.get("name", ""), ns)
                if sec is None and not s.get("optional"):
                    raise VolumeError(f'secret "{s.get("name")}" not found')
                items = (sec or {}).get("data") or {}
                data.update(self._select(items, s.get("items"), base64.b64decode))
            elif "downwardAPI" in source:
                for it in source["downwardAPI"].get("items") or []:
                    data[it["path"]] = self._field(pod, it).encode()
        return self._files(pod_dir, "projected", name, data, {"defaultMode": src.get("defaultMode")}, in_place)

    def _persistentVolumeClaim(self, pod, pod_dir, name, src) -> Path:
        ns = pod["metadata"]["namespace"]
        claim = self.client.get("PersistentVolumeClaim", src.get("claimName", ""), ns)
        if claim is None:
            raise VolumeError(f'persistentvolumeclaim "{src.get("claimName")}" not found')
        pv_name = claim.get("spec", {}).get("volumeName")
        if not pv_name or claim.get("status", {}).get("phase") != "Bound":
            raise VolumeError(f'persistentvolumeclaim "{src.get("claimName")}" is not bound yet')
        pv = self.client.get("PersistentVolume", pv_name)
        if pv is None:
            raise VolumeError(f'persistentvolume "{pv_name}" not found')
        spec = pv.get("spec", {})
        path = (spec.get("local") or spec.get("hostPath") or {}).get("path")
        if not path:
            raise VolumeError(f'persistentvolume "{pv_name}" has no local or hostPath source; '
                              "gpulab's simulated nodes mount only those", retry=False)
        host = node_host_path(self.nodes_dir, pod["spec"]["nodeName"], path)
        if not host.exists():
            host.mkdir(parents=True)
            host.chmod(0o777)
        return host

    # -- helpers -------------------------------------------------------------

    @staticmethod
    def _select(data: dict[str, str], items: list[dict] | None, decode) -> dict[str, bytes]:
        if not items:
            return {k: decode(v) for k, v in data.items()}
        return {it.get("path", it["key"]): decode(data[it["key"]]) for it in items if it["key"] in data}

    def _files(self, pod_dir: Path, kind: str, name: str, data: dict[str, bytes], src: dict,
               in_place: bool = False) -> Path:
        """Write a volume of files. ``in_place``: a running container has the directory mounted, so it
        stays (same inode): each file is replaced by a rename, and a key that went is removed."""
        d = pod_dir / "volumes" / kind / name
        if d.exists() and not in_place:
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)
        mode = src.get("defaultMode")
        mode = 0o644 if mode is None else int(mode)
        items = src.get("items")
        selected = data if not items else {it.get("path", it["key"]): data[it["key"]]
                                           for it in items if it["key"] in data}
        for rel, content in selected.items():
            f = d / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            if in_place:
                if f.is_file() and f.read_bytes() == content:
                    continue
                tmp = f.with_name(f".{f.name}.tmp")
                tmp.write_bytes(content)
                os.chmod(tmp, mode)
                os.replace(tmp, f)
            else:
                f.write_bytes(content)
                os.chmod(f, mode)
        if in_place:
            for old in [p for p in d.rglob("*") if p.is_file()]:
                if old.relative_to(d).as_posix() not in selected:
                    old.unlink()
        d.chmod(0o755)
        return d

    def _field(self, pod: dict[str, Any], item: dict[str, Any]) -> str:
        if "fieldRef" in item:
            return field_value(pod, item["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in item:
            return resource_value(pod, item["resourceFieldRef"])
        return ""

    def _token(self, pod: dict[str, Any], sat: dict[str, Any]) -> str:
        md = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [sat["audience"]] if sat.get("audience") else [],
                "expirationSeconds": int(sat.get("expirationSeconds") or 3607),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]},
            },
        }
        try:
            resp = self.client.request(
                "POST", f"/api/v1/namespaces/{md['namespace']}/serviceaccounts/{sa}/token", body)
        except (api.ApiError, api.NotFound) as e:
            raise VolumeError(f"cannot request a token for service account {sa!r}: {e}") from None
        return resp["status"]["token"]


def field_value(pod: dict[str, Any], path: str) -> str:
    md, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": md.get("name", ""),
        "metadata.namespace": md.get("namespace", ""),
        "metadata.uid": md.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", "127.0.0.1"),
        "status.podIP": status.get("podIP", ""),
    }
    if path in simple:
        return simple[path]
    for prefix, values in (("metadata.labels", md.get("labels") or {}),
                           ("metadata.annotations", md.get("annotations") or {})):
        if path == prefix:
            return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
        if path.startswith(prefix + "['") and path.endswith("']"):
            return values.get(path[len(prefix) + 2:-2], "")
    return ""


def resource_value(pod: dict[str, Any], ref: dict[str, Any]) -> str:
    from kubernetes.utils import parse_quantity

    container = ref.get("containerName")
    res = ref.get("resource", "")
    kind, _, name = res.partition(".")
    for c in pod["spec"].get("containers") or []:
        if container and c["name"] != container:
            continue
        value = (c.get("resources") or {}).get(kind, {}).get(name)
        if value is None:
            return "0"
        divisor = parse_quantity(ref.get("divisor") or "1")
        import math

        return str(math.ceil(parse_quantity(value) / divisor))
    return "0"
