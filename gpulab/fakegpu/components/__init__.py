"""NVIDIA's node components, each written once against one host interface.

==================  =====================================  ===================================
component           embedded backend (node agent program)  kind backend (DaemonSet process)
==================  =====================================  ===================================
device plugin       k8s-device-plugin ``nvidia-device-      ``python -m gpulab.fakegpu.daemon
                    plugin``                               device-plugin``
config manager      k8s-device-plugin ``config-manager``   ``... daemon config-manager``
GFD                 k8s-device-plugin                      ``... daemon gfd``
                    ``gpu-feature-discovery``
MIG manager         k8s-mig-manager                        ``... daemon mig-manager``
DCGM exporter       dcgm-exporter                          ``... daemon dcgm-exporter``
==================  =====================================  ===================================

Each module's ``run(host)`` is the component's whole program and returns its
exit code; ``SOURCE`` is the Go source position its klog lines name.
The host (:class:`~gpulab.fakegpu.components.host.Host`) is
:class:`gpulab.fakegpu.operands.EmbeddedHost` or
:class:`gpulab.fakegpu.daemon.KindHost`. The operator validator runs only on
the embedded backend (kind's DaemonSets have none) and stays in
:mod:`gpulab.fakegpu.operands`.
"""

from __future__ import annotations

from typing import Callable

from . import configmanager, dcgmexporter, deviceplugin, featurediscovery, migmanager
from .host import Host

#: Component name (the kind daemon's subcommand) -> (run, klog source).
COMPONENTS: dict[str, tuple[Callable[[Host], int], str]] = {
    "device-plugin": (deviceplugin.run, deviceplugin.SOURCE),
    "gfd": (featurediscovery.run, featurediscovery.SOURCE),
    "config-manager": (configmanager.run, configmanager.SOURCE),
    "mig-manager": (migmanager.run, migmanager.SOURCE),
    "dcgm-exporter": (dcgmexporter.run, dcgmexporter.SOURCE),
}
