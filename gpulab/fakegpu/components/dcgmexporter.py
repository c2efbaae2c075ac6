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
    server = dcgm.serve(host.metrics_view(), host.metrics_address())
    address, port = server.server_address[:2]
    endpoint = f"http://{address}:{port}/metrics"
    # Where Prometheus finds it: the pod's IP and the port of DCGM_EXPORTER_LISTEN (":9400").
    listen_port = int(host.settings.flags.get("DCGM_EXPORTER_LISTEN", ":9400").rpartition(":")[2] or 9400)
    listener = host.pod_listener(listen_port)
    in_pod = dcgm.serve(host.metrics_view(), listener) if listener is not None else None
    if in_pod is not None:
        out.info(f"Serving metrics on the pod network at {listener.getsockname()[0]}:{listen_port}")
    try:
        host.metrics_published(endpoint)
        out.info("Kubernetes metrics collection enabled!")
        out.info(f"Starting webserver; metrics at {endpoint}")
        while not host.wait(3600):
            pass
    finally:
        for running in (server, in_pod):
            if running is not None:
                running.shutdown()
                running.server_close()
    return 0
