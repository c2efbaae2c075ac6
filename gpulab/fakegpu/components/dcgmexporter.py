"""``dcgm-exporter``: DCGM metrics of the node's GPUs in Prometheus format.

Served by :func:`gpulab.fakegpu.dcgm.serve` where the host says
(:meth:`~gpulab.fakegpu.components.host.Host.metrics_address`), which then
tells whoever scrapes it (:meth:`~gpulab.fakegpu.components.host.Host.metrics_published`).
With the driver not answering (fault ``driver-unreachable``) it exits non-zero.
"""

from __future__ import annotations

from .. import dcgm
from .host import Host

SOURCE = "main.go:95"


def run(host: Host) -> int:
    out = host.log
    out.info("Starting dcgm-exporter")
    if host.gpus() is None:
        out.error("Error: no GPUs on this node")
        return 1
    if host.faults().driver_unreachable:
        out.error("Failed to initialize NVML: Driver Not Loaded")
        return 1
    server = dcgm.serve(host.metrics_view(), host.metrics_address(),  # type: ignore[arg-type]
                        thread_name=f"dcgm-exporter-{host.node}")
    address, port = server.server_address[:2]
    endpoint = f"http://{address}:{port}/metrics"
    try:
        host.metrics_published(endpoint)
        out.info("Kubernetes metrics collection enabled!")
        out.info(f"Starting webserver; metrics at {endpoint}")
        while not host.wait(3600):
            pass
    finally:
        server.shutdown()
        server.server_close()
    return 0
