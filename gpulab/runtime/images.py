"""Images whose real program gpulab has: their entrypoint runs as the container's process.

No image is ever pulled. A container with ``command`` runs that command with
the host's programs; a container without one runs its image's entrypoint when
gpulab has the image's program — CoreDNS's, built from source with the control
plane, or the host's ``python3`` for the ``python`` images — and is simulated otherwise (:mod:`gpulab.runtime.containers`). The
composition root registers what it has (:class:`ImageCatalog`); the program is
mounted read-only at the path the real image keeps it, so a pod that names
``/coredns`` in its ``command`` finds it too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .sandbox import Mount


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    """One image's program: its repository (any tag or digest), ENTRYPOINT, and the host binary behind it."""

    repository: str
    argv: tuple[str, ...]
    # The program built for it, mounted at argv[0]; None: the host's own (a container sees the host's /usr).
    binary: Path | None = None

    def mounts(self) -> list[Mount]:
        return [Mount(str(self.binary), self.argv[0], read_only=True)] if self.binary else []


def image_repository(image: str) -> str:
    """``registry.k8s.io/coredns/coredns:v1.14.7`` → ``registry.k8s.io/coredns/coredns`` (tag and digest dropped).

    Both kinds of image gpulab runs are known by it: those with a real program (here) and the GPU
    stack's built-in programs (:mod:`gpulab.runtime.programs`).
    """
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


#: Images whose program every machine gpulab runs on has: the host's python3 (apt.txt) is the official
#: Python image's entrypoint (its CMD is ``python3``; a pod's ``args`` follow it, as a runtime appends them).
HOST_PROGRAMS = tuple(Entrypoint(repo, ("python3",)) for repo in ("python", "library/python",
                                                                   "docker.io/library/python"))


class ImageCatalog:
    def __init__(self, entries: list[Entrypoint] | None = None):
        self.entries = {e.repository: e for e in entries or []}

    def lookup(self, image: str) -> Entrypoint | None:
        return self.entries.get(image_repository(image))
