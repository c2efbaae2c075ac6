"""The kubelet's image manager on simulated nodes: pull policy, each node's images, pulls over its network.

Before a container is created the kubelet makes sure its image is on the node
(``pkg/kubelet/images``, ``EnsureImageExists``), and says so in the pod's Events:

- the pull policy, as the apiserver defaulted it: ``Always`` for ``:latest`` or an
  image without a tag or digest, ``IfNotPresent`` otherwise (``Never`` when the pod says so);
- an image already on the node that need not be pulled: ``Pulled`` ``Container image "X" already
  present on machine and can be accessed by the pod``;
- ``Never`` and the image is missing: a Warning ``ErrImageNeverPull`` ``Container image "X" is not
  present with pull policy of Never``, the container waits with that reason, and the kubelet
  tries again later;
- otherwise a pull: ``Pulling`` ``Pulling image "X"``, the container waits in
  ``ContainerCreating``, then ``Pulled`` ``Successfully pulled image "X" in 27.712s (27.712s
  including waiting). Image size: 14525000000 bytes.`` (the time of the pull itself and since the
  ``Pulling`` event, Go durations truncated to milliseconds, as ``image_manager.go`` writes them).

What is simulated is the hardware: the network. No bytes move; a pull takes the registry's
round trip (:data:`REGISTRY_ROUND_TRIP`, also when the image is there already: ``Always`` asks the
registry every time) plus the image's size over the node pool's ``imagePullBandwidth`` (a topology
field) when the node lacks it. Sizes come from :data:`IMAGES` (approximate compressed sizes of the
amd64 images, as a node's ``crictl images`` lists them); an image not in it is
:data:`DEFAULT_IMAGE_SIZE`. Every reference exists: there is no registry to miss one.

Pulls on one node run one at a time (``serializeImagePulls: true``, the kubelet's default): a
second pod's pull of the same image waits for the first and then finds the layers there (a round
trip only), and its ``including waiting`` time says how long it queued.

Each node keeps its images in ``nodes/<node>/images.json`` under the cluster's directory, so a node
agent that restarts finds them (``gpulab reset`` and ``gpulab down --purge`` remove them with the
nodes). A node starts with the images the course's node image ships (:data:`IMAGES` entries marked
``preloaded``: the cluster's own components and the images the lessons and labs run, as a cloud's
node image or a pre-pull DaemonSet would have them); those are ``already present`` from the start.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .._fsutil import atomic_write_json, locked

#: The pull policies a container may have.
POLICIES = ("Always", "IfNotPresent", "Never")
#: Seconds of every pull that reaches the registry: resolving the reference and reading the manifest.
REGISTRY_ROUND_TRIP = 0.05
#: The size of an image :data:`IMAGES` does not list (256 MiB).
DEFAULT_IMAGE_SIZE = 256 * 2**20
#: When the kubelet tries again after ErrImageNeverPull (its pod worker's back-off for a failed sync).
NEVER_PULL_RETRY = 10.0
#: The image of lesson 06: gpulab/llm-server (45 MB) with a 7B model's weights baked in at BAKED_MODEL_PATH
#: (fp16: 7.24e9 parameters × 2 bytes), served by default.
BAKED_WEIGHTS_IMAGE = "gpulab/llm-server:0.1-7b-weights"
BAKED_WEIGHTS_BYTES = 14_480_000_000
BAKED_MODEL, BAKED_MODEL_PATH = "llama-7b", "/models/llama-7b"


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """What gpulab knows of an image: its size in bytes, and whether the course's node image ships it."""

    size: int
    preloaded: bool = True


#: Images by repository (any tag) or by reference (``repository:tag``, which wins), approximate compressed
#: sizes of the amd64 images (not measured by gpulab). Short Docker Hub names as people write them.
IMAGES: dict[str, ImageInfo] = {
    # the cluster's own components and add-ons
    "registry.k8s.io/coredns/coredns": ImageInfo(22_000_000),
    "registry.k8s.io/e2e-test-images/agnhost": ImageInfo(52_000_000),
    "registry.k8s.io/metrics-server/metrics-server": ImageInfo(20_000_000),
    "quay.io/prometheus/prometheus": ImageInfo(130_000_000),
    "prom/prometheus": ImageInfo(130_000_000),
    "registry.k8s.io/kube-state-metrics/kube-state-metrics": ImageInfo(20_000_000),
    "registry.k8s.io/prometheus-adapter/prometheus-adapter": ImageInfo(26_000_000),
    # NVIDIA's GPU Operator and its operands
    "nvcr.io/nvidia/gpu-operator": ImageInfo(90_000_000),
    "nvcr.io/nvidia/k8s-device-plugin": ImageInfo(130_000_000),
    "nvcr.io/nvidia/cloud-native/k8s-mig-manager": ImageInfo(150_000_000),
    "nvcr.io/nvidia/cloud-native/gpu-operator-validator": ImageInfo(150_000_000),
    "nvcr.io/nvidia/k8s/dcgm-exporter": ImageInfo(480_000_000),
    # what the lessons and labs run
    "busybox": ImageInfo(2_200_000),
    "nginx": ImageInfo(72_000_000),
    "python": ImageInfo(380_000_000),
    "ubuntu": ImageInfo(30_000_000),
    "nvcr.io/nvidia/cuda": ImageInfo(120_000_000),
    "nvcr.io/nvidia/pytorch": ImageInfo(10_500_000_000),
    "pytorch/pytorch": ImageInfo(3_500_000_000),
    "vllm/vllm-openai": ImageInfo(5_000_000_000),
    "nvcr.io/nvidia/tritonserver": ImageInfo(7_000_000_000),
    "jupyter/pytorch-notebook": ImageInfo(4_000_000_000),
    "gpulab/llm-server": ImageInfo(45_000_000),
    # lesson 06: weights in the image make it big, and a node that lacks it pulls all of it
    BAKED_WEIGHTS_IMAGE: ImageInfo(45_000_000 + BAKED_WEIGHTS_BYTES, preloaded=False),
}


# -- references ------------------------------------------------------------------------------------------------

def _split(image: str) -> tuple[str, str]:
    """``image`` as (normalized repository, ``:tag`` or ``@digest``), as the runtime names it:
    ``busybox`` is ``docker.io/library/busybox`` with the tag ``latest``."""
    image = image.strip()
    name, sep, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = ""
    if ":" in last:
        name, tag = name[: len(name) - len(last)] + last.split(":", 1)[0], last.split(":", 1)[1]
    first, slash, rest = name.partition("/")
    if not slash:
        name = f"docker.io/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    elif first in ("index.docker.io", "registry-1.docker.io"):
        name = f"docker.io/{rest}"
    if name.startswith("docker.io/") and name.count("/") == 1:
        name = "docker.io/library/" + name.split("/", 1)[1]
    if sep:
        return name, f"@{digest}"
    return name, f":{tag or 'latest'}"


def normalize(image: str) -> str:
    """The reference a node's image store keys ``image`` by: ``nginx:1.27`` → ``docker.io/library/nginx:1.27``."""
    repository, version = _split(image)
    return repository + version


def repository(image: str) -> str:
    """The normalized repository of ``image``: ``nginx:1.27`` → ``docker.io/library/nginx``."""
    return _split(image)[0]


_BY_REFERENCE = {normalize(k): v for k, v in IMAGES.items() if ":" in k.rsplit("/", 1)[-1]}
_BY_REPOSITORY = {repository(k): v for k, v in IMAGES.items() if ":" not in k.rsplit("/", 1)[-1]}


def info(image: str) -> ImageInfo:
    """What :data:`IMAGES` says of ``image`` (its reference first, then its repository), or the default."""
    return (_BY_REFERENCE.get(normalize(image)) or _BY_REPOSITORY.get(repository(image))
            or ImageInfo(DEFAULT_IMAGE_SIZE, preloaded=False))


def default_policy(image: str) -> str:
    """The pull policy the apiserver gives a container that names none: ``Always`` for ``:latest`` or no tag
    (and no digest), else ``IfNotPresent``."""
    _, version = _split(image)
    return "Always" if version == ":latest" else "IfNotPresent"


# -- the kubelet's words ----------------------------------------------------------------------------------------

def go_duration(seconds: float) -> str:
    """A duration truncated to milliseconds, as Go's ``time.Duration.String`` writes it (``27.712s``,
    ``450ms``, ``1m2.5s``, ``0s``)."""
    ms = max(0, int(seconds * 1000 + 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    secs = f"{whole}.{frac:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def present_message(image: str) -> str:
    return f'Container image "{image}" already present on machine and can be accessed by the pod'


def never_message(image: str) -> str:
    return f'Container image "{image}" is not present with pull policy of Never'


def pulling_message(image: str) -> str:
    return f'Pulling image "{image}"'


def pulled_message(image: str, pull_seconds: float, total_seconds: float, size: int) -> str:
    return (f'Successfully pulled image "{image}" in {go_duration(pull_seconds)} '
            f"({go_duration(total_seconds)} including waiting). Image size: {size} bytes.")


# -- one node's images -------------------------------------------------------------------------------------------

class NodeImages:
    """The images on one node (what ``crictl images`` lists there), in ``nodes/<node>/images.json``.

    The file is the truth, read on every question, so that another process (a lesson removing an image,
    as ``crictl rmi`` would) and a restarted node agent see the same store. It maps a normalized reference,
    or a repository for the preloaded images of any tag, to ``{"size": bytes, "source": "preloaded" |
    "pulled", "at": seconds since the epoch}``.
    """

    def __init__(self, path: Path):
        self.path = path

    def _read(self) -> dict[str, dict[str, Any]] | None:
        """The file's images; None when the node has no store yet."""
        try:
            return dict(json.loads(self.path.read_text(encoding="utf-8")).get("images") or {})
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _shipped() -> dict[str, dict[str, Any]]:
        """A new node's images: those its node image ships."""
        return {key: {"size": i.size, "source": "preloaded", "at": time.time()}
                for key, i in {**_BY_REPOSITORY, **_BY_REFERENCE}.items() if i.preloaded}

    def _load(self) -> dict[str, dict[str, Any]]:
        images = self._read()
        if images is None:
            with locked(self.path):
                images = self._read()
                if images is None:
                    images = self._shipped()
                    self._save(images)
        return images

    def _save(self, images: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"images": images})

    def _change(self, change: Callable[[dict[str, dict[str, Any]]], None]) -> None:
        with locked(self.path):
            images = self._read()
            images = self._shipped() if images is None else images
            change(images)
            self._save(images)

    def has(self, image: str) -> bool:
        images = self._load()
        ref = normalize(image)
        entry = images.get(ref) or images.get(repository(image))
        # A preloaded repository stands for every tag of it, unless the reference has entries of its own.
        return entry is not None and (ref in images or ref not in _BY_REFERENCE)

    def add(self, image: str, size: int) -> None:
        self._change(lambda images: images.__setitem__(normalize(image),
                                                       {"size": size, "source": "pulled", "at": time.time()}))

    def remove(self, image: str) -> bool:
        """Take ``image`` off the node (``crictl rmi``); a preloaded repository goes with all its tags.
        False when the node did not have it."""
        if not self.has(image):
            return False

        def take(images: dict[str, dict[str, Any]]) -> None:
            images.pop(normalize(image), None)
            if images.get(repository(image), {}).get("source") == "preloaded":
                images.pop(repository(image))

        self._change(take)
        return True

    def list(self) -> list[dict[str, Any]]:
        """``{"image", "size", "source"}`` of every image here, by name."""
        return [{"image": key, "size": v.get("size", 0), "source": v.get("source", "")}
                for key, v in sorted(self._load().items())]


def store_path(nodes_dir: Path, node: str) -> Path:
    return Path(nodes_dir) / node / "images.json"


# -- pulls -------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Pull:
    """One pull the kubelet asked for: done once the image is on the node."""

    image: str           # as the pod names it (the events quote it so)
    size: int
    requested: float     # monotonic time of the Pulling event
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    pull_seconds: float = 0.0
    total_seconds: float = 0.0

    def pulled_message(self) -> str:
        return pulled_message(self.image, self.pull_seconds, self.total_seconds, self.size)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``EnsureImageExists`` decided: ``present`` (go on), ``never`` (ErrImageNeverPull) or ``pull``."""

    kind: str
    message: str
    pull: Pull | None = None


class _Puller(threading.Thread):
    """A node's serial image puller: one pull at a time, in the order they were asked for."""

    def __init__(self, manager: "ImageManager", node: str):
        super().__init__(daemon=True, name=f"image-puller-{node}")
        self.manager, self.node = manager, node
        self.requests: queue.Queue[Pull] = queue.Queue()

    def run(self) -> None:
        m = self.manager
        while not m.stop.is_set():
            try:
                pull = self.requests.get(timeout=0.5)
            except queue.Empty:
                continue
            began = time.monotonic()
            store = m.store(self.node)
            seconds = REGISTRY_ROUND_TRIP
            if not store.has(pull.image):
                seconds += pull.size / m.bandwidth(self.node)
            if m.stop.wait(seconds):
                return
            store.add(pull.image, pull.size)
            now = time.monotonic()
            pull.pull_seconds, pull.total_seconds = now - began, now - pull.requested
            pull.done.set()


class ImageManager:
    """Every simulated node's images and pulls. ``bandwidth(node)``: bytes per second of the node's pulls."""

    def __init__(self, nodes_dir: Path, bandwidth: Callable[[str], float]):
        self.nodes_dir = Path(nodes_dir)
        self.bandwidth = bandwidth
        self.stop = threading.Event()
        self._pullers: dict[str, _Puller] = {}
        self._lock = threading.Lock()

    def store(self, node: str) -> NodeImages:
        return NodeImages(store_path(self.nodes_dir, node))

    def ensure(self, node: str, image: str, policy: str | None = None) -> Decision:
        """The kubelet's ``EnsureImageExists`` for a container of ``node``: a :class:`Decision`; for ``pull``
        the pull is queued on the node's puller (its ``Pulling`` event is the caller's to write now)."""
        policy = policy if policy in POLICIES else default_policy(image)
        present = self.store(node).has(image)
        if policy == "Never" or (policy == "IfNotPresent" and present):
            return Decision("present", present_message(image)) if present else Decision("never", never_message(image))
        pull = Pull(image, info(image).size, time.monotonic())
        with self._lock:
            puller = self._pullers.get(node)
            if puller is None or not puller.is_alive():
                puller = self._pullers[node] = _Puller(self, node)
                puller.start()
        puller.requests.put(pull)
        return Decision("pull", pulling_message(image), pull)
