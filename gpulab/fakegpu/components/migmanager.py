"""``nvidia-mig-manager``: applies ``nvidia.com/mig.config`` to the node's GPUs.

The decisions are :func:`gpulab.fakegpu.mig.decide_mig_transition`'s; this
carries them out: label patches, waiting for the operand pods to go, deleting
validator pods, changing the geometry. It reports on the node: the
``nvidia.com/mig.config.state`` label, and a ``MigConfigApplied`` or
``MigConfigFailed`` Event. A change under pods holding the GPUs
(:func:`~gpulab.fakegpu.components.host.pods_holding_gpus`) fails, as on real
GPUs ("In use by another client").
"""

from __future__ import annotations

from typing import Any

from ... import _poll
from ...kube import api
from .. import mig
from .host import RESYNC_S, Host, node_labels

SOURCE = "main.go:287"
POLL = 0.5
WAIT_S = 120.0
COMPONENT = "nvidia-mig-manager"


class MigManagerMain:
    def __init__(self, host: Host):
        self.host = host
        self.out = host.log
        self.namespace = host.settings.namespace

    def run(self) -> int:
        host = self.host
        gpus = host.gpus()
        if gpus is None or not gpus.model.mig_capable:
            self.out.info("No MIG-capable GPU on this node; nothing to do. Waiting indefinitely.")
            while not host.wait(3600):
                pass
            return 0
        self.out.info(f"Watching changes to the '{mig.MIG_CONFIG_LABEL}' label on node {host.node}")
        last: object = object()
        while True:
            try:
                labels = node_labels(host)
            except (api.ApiError, api.NotFound, api.Conflict, OSError) as e:
                self.out.warning(f"cannot read node {host.node}: {e}; retrying")
                labels = {}
            if labels and labels.get(mig.MIG_CONFIG_LABEL) != last:
                last = labels.get(mig.MIG_CONFIG_LABEL)
                self.out.info(f"Updating to MIG config: {last}")
                self._reconfigure(labels)
            # A change of the label wakes it; without the Node, it looks again soon.
            if host.wait(RESYNC_S if labels else POLL):
                return 0

    def _reconfigure(self, labels: dict[str, str]) -> None:
        host = self.host
        gpus = host.gpus()
        assert gpus is not None
        restore = {k: ("false" if labels.get(k) == "false" else "true") for k in mig.CLIENT_DEPLOY_LABELS}
        requested = labels.get(mig.MIG_CONFIG_LABEL)
        try:
            decision = mig.decide_mig_transition(labels, gpus.model, applied=host.mig_layout(),
                                                 gpu_pods=host.pods_holding_gpus())
            for step in decision.steps:
                if host.stopping():
                    return
                self.out.info(step.message)
                if step.action == "set-labels":
                    host.patch_node_labels(dict(step.labels))
                elif step.action == "wait-pods-deleted":
                    if not self._wait_gone(step.selector or ""):
                        return
                elif step.action == "delete-pods":
                    for pod in self._pods(step.selector or ""):
                        host.client.delete("Pod", pod["metadata"]["name"], self.namespace, grace_seconds=0)
                elif step.action == "apply-mig":
                    host.apply_mig(step.layout)
        except (TimeoutError, api.ApiError, api.NotFound, api.Conflict, OSError) as e:
            self.out.error(f"Error applying MIG configuration: {e}")
            try:
                host.patch_node_labels({**restore, mig.MIG_CONFIG_STATE_LABEL: mig.STATE_FAILED})
            except (api.ApiError, api.NotFound, api.Conflict, OSError) as again:
                self.out.error(f"cannot restore the node's labels: {again}")
            host.event("MigConfigFailed", f"MIG config {requested!r}: {e}", "Warning", component=COMPONENT)
            return
        if decision.outcome == "failed":
            host.event("MigConfigFailed", decision.reason, "Warning", component=COMPONENT)
        elif decision.outcome == "reconfigured":
            host.event("MigConfigApplied", decision.reason, component=COMPONENT)

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        return self.host.client.list("Pod", self.namespace, label_selector=selector,
                                     field_selector=f"spec.nodeName={self.host.node}")

    def _wait_gone(self, selector: str) -> bool:
        """Until no pod matches ``selector`` on the node; False when asked to stop. Raises TimeoutError."""
        gone = _poll.until(lambda: not self._pods(selector), WAIT_S,
                           lambda _: TimeoutError(f"pods {selector} still on the node after {WAIT_S:.0f} s"),
                           interval=POLL, pause=self.host.wait)
        return gone is not None


def run(host: Host) -> int:
    return MigManagerMain(host).run()
