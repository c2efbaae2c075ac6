"""Services: which pods a Service sends traffic to, from its EndpointSlices."""

from __future__ import annotations

from .lesson import current
from .table import Table

__all__ = ["endpoints"]


def endpoints(service: str, namespace: str | None = None) -> Table:
    """The endpoints of a Service, from its EndpointSlices: POD, ADDRESS, READY, SERVING, TERMINATING.

    Only a READY endpoint receives traffic through the Service; a pod whose
    readiness probe has not passed is listed with READY false.
    """
    ns = namespace or current().namespace
    rows = []
    for eps in current().kube.list("EndpointSlice", ns, label_selector=f"kubernetes.io/service-name={service}"):
        for ep in eps.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            rows.append({"POD": (ep.get("targetRef") or {}).get("name"), "ADDRESS": ", ".join(ep.get("addresses") or []),
                         "READY": bool(cond.get("ready")), "SERVING": bool(cond.get("serving")),
                         "TERMINATING": bool(cond.get("terminating"))})
    rows.sort(key=lambda r: r["POD"] or "")
    return Table(rows, ["POD", "ADDRESS", "READY", "SERVING", "TERMINATING"], title=f"service/{service} 的端点")
