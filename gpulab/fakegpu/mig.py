"""The NVIDIA MIG manager's reconfiguration, as pure decisions.

On a real node the MIG manager watches ``nvidia.com/mig.config``; when it
changes it validates the named config, marks the node
``nvidia.com/mig.config.state=pending``, pauses the GPU Operator's own GPU
clients by flipping their ``nvidia.com/gpu.deploy.*`` labels to
``paused-for-mig-change``, waits for their pods to go, deletes the
validator pods, changes MIG mode and geometry, restarts the operator
validator, restores the deploy labels and ends in ``success`` — or in
``failed``, restoring the deploy labels on the way out.

:func:`decide_mig_transition` returns that whole sequence as data (label
patches, pod waits and deletions, the geometry to apply, log lines) for a
caller that talks to Kubernetes and updates the simulated GPUs. It never
touches user pods: the real MIG manager does not evict them, it simply
fails when their processes hold the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpulab.fakegpu.gfd import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL
from gpulab.hardware.models import GpuModel, GpuModelError, MigLayout, MigNotSupported, UnknownMigLayout, get_model

__all__ = [
    "MIG_CONFIG_LABEL",
    "MIG_CONFIG_STATE_LABEL",
    "STATE_PENDING",
    "STATE_REBOOTING",
    "STATE_SUCCESS",
    "STATE_FAILED",
    "PAUSED_FOR_MIG_CHANGE",
    "CLIENT_DEPLOY_LABELS",
    "OPERAND_POD_SELECTORS",
    "VALIDATOR_POD_SELECTORS",
    "OPERATOR_VALIDATOR_SELECTOR",
    "MigStep",
    "MigDecision",
    "decide_mig_transition",
    "apply_label_patch",
]

STATE_PENDING = "pending"
STATE_REBOOTING = "rebooting"  # only when a MIG mode change needs a reboot; not simulated
STATE_SUCCESS = "success"
STATE_FAILED = "failed"

PAUSED_FOR_MIG_CHANGE = "paused-for-mig-change"

#: Deploy labels of the GPU clients the MIG manager stops, in its order.
CLIENT_DEPLOY_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
)
#: Pods (in the operator namespace, on this node) it waits to disappear.
OPERAND_POD_SELECTORS = (
    ("app=nvidia-device-plugin-daemonset", "device-plugin"),
    ("app=gpu-feature-discovery", "gpu-feature-discovery"),
    ("app=nvidia-dcgm-exporter", "dcgm-exporter"),
    ("app=nvidia-dcgm", "dcgm"),
)
#: Validation workload pods it deletes before touching the GPUs.
VALIDATOR_POD_SELECTORS = (
    ("app=nvidia-cuda-validator", "cuda-validator"),
    ("app=nvidia-device-plugin-validator", "plugin-validator"),
)
#: Deleted after the change so that all validations run again.
OPERATOR_VALIDATOR_SELECTOR = "app=nvidia-operator-validator"

Action = Literal["log", "set-labels", "wait-pods-deleted", "delete-pods", "apply-mig"]
Outcome = Literal["idle", "already-applied", "reconfigured", "failed"]


@dataclass(frozen=True)
class MigStep:
    """One thing the MIG manager does, in order.

    ``set-labels``: merge-patch ``labels`` onto the node (None deletes).
    ``wait-pods-deleted`` / ``delete-pods``: pods matching ``selector`` in
    the GPU Operator namespace on this node. ``apply-mig``: give every GPU
    of the node the geometry ``layout``. ``message`` is the log line.
    """

    action: Action
    message: str
    labels: Mapping[str, str | None] = field(default_factory=dict)
    selector: str | None = None
    layout: MigLayout | None = None


@dataclass(frozen=True)
class MigDecision:
    """What the MIG manager does about a node's ``nvidia.com/mig.config``."""

    requested: str | None
    outcome: Outcome
    #: Final ``nvidia.com/mig.config.state`` (None: the label is untouched).
    state: str | None
    reason: str
    #: The node's MIG geometry once the steps ran (None: MIG disabled).
    layout: MigLayout | None
    steps: tuple[MigStep, ...] = ()

    @property
    def log(self) -> list[str]:
        return [s.message for s in self.steps]

    @property
    def label_patches(self) -> list[Mapping[str, str | None]]:
        return [s.labels for s in self.steps if s.action == "set-labels"]

    def final_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        """``labels`` after every label patch of this decision."""
        out = dict(labels)
        for patch in self.label_patches:
            out = apply_label_patch(out, patch)
        return out


def apply_label_patch(labels: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    """Merge-patch semantics for labels: a None value removes the key."""
    out = dict(labels)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _paused(value: str | None) -> str:
    # A deploy label set to 'false' belongs to someone else (an admin); the
    # MIG manager leaves it alone, and sets every other one, even absent.
    return "false" if value == "false" else PAUSED_FOR_MIG_CHANGE


def _restored(value: str | None) -> str:
    return "false" if value == "false" else "true"


def _finish(deploy: Mapping[str, str | None], state: str) -> list[MigStep]:
    """The MIG manager's exit path: restart GPU clients, then set the state."""
    return [
        MigStep(
            "set-labels",
            "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
            "component-specific nodeSelector labels",
            labels={k: _restored(v) for k, v in deploy.items()},
        ),
        MigStep(
            "set-labels",
            f"Changing the '{MIG_CONFIG_STATE_LABEL}' node label to '{state}'",
            labels={MIG_CONFIG_STATE_LABEL: state},
        ),
    ]


def _resolve_applied(model: GpuModel, applied: MigLayout | str | None) -> MigLayout | None:
    """The current geometry, with "MIG disabled" always spelled None."""
    layout = model.layout(applied) if isinstance(applied, str) else applied
    return layout if layout is not None and layout.mig_enabled else None


def decide_mig_transition(
    labels: Mapping[str, str],
    model: GpuModel | str,
    *,
    applied: MigLayout | str | None = None,
    gpu_pods: Sequence[str] = (),
) -> MigDecision:
    """Decide what the MIG manager does for a node.

    ``labels`` are the node's current labels, ``applied`` the geometry its
    GPUs have now (a layout or layout name; None: MIG disabled),
    ``gpu_pods`` the user pods whose processes currently use the node's
    GPUs (``namespace/name``). Changing MIG geometry under running GPU
    processes fails on real hardware ("In use by another client"), so a
    non-empty ``gpu_pods`` makes a needed change fail.
    """
    model = get_model(model)
    current = _resolve_applied(model, applied)
    requested = labels.get(MIG_CONFIG_LABEL) or None
    if requested is None:
        return MigDecision(
            None, "idle", None, f"no {MIG_CONFIG_LABEL} label: nothing to do", current
        )

    deploy = {k: labels.get(k) for k in CLIENT_DEPLOY_LABELS}
    steps: list[MigStep] = [
        MigStep("log", f"Current value of '{k}={'' if v is None else v}'") for k, v in deploy.items()
    ]
    steps.append(MigStep("log", "Asserting that the requested configuration is present in the configuration file"))

    try:
        target = model.layout(requested)
    except (UnknownMigLayout, MigNotSupported) as exc:
        reason = str(exc)
        if isinstance(exc, MigNotSupported):
            reason += (
                "; note: on a real cluster the MIG manager is only deployed on MIG-capable nodes "
                "(nvidia.com/gpu.deploy.mig-manager), so the label would simply be ignored"
            )
        steps.append(MigStep("log", f"Error validating MIG configuration: {exc}"))
        steps += _finish(deploy, STATE_FAILED)
        return MigDecision(requested, "failed", STATE_FAILED, reason, current, tuple(steps))
    except GpuModelError as exc:  # e.g. a layout that cannot be placed
        steps.append(MigStep("log", f"Error validating MIG configuration: {exc}"))
        steps += _finish(deploy, STATE_FAILED)
        return MigDecision(requested, "failed", STATE_FAILED, str(exc), current, tuple(steps))

    steps.append(MigStep("log", "Checking if the selected MIG config is currently applied or not"))
    if target.same_geometry(current):
        steps.append(MigStep("log", "Selected MIG config is already applied"))
        steps += _finish(deploy, STATE_SUCCESS)
        return MigDecision(
            requested, "already-applied", STATE_SUCCESS,
            f"MIG config {target.name!r} is already applied", current, tuple(steps),
        )

    steps.append(MigStep("set-labels", f"Changing the '{MIG_CONFIG_STATE_LABEL}' node label to '{STATE_PENDING}'",
                         labels={MIG_CONFIG_STATE_LABEL: STATE_PENDING}))
    steps.append(MigStep(
        "set-labels",
        "Shutting down all GPU clients in Kubernetes by disabling their component-specific nodeSelector labels",
        labels={k: _paused(v) for k, v in deploy.items()},
    ))
    for selector, what in OPERAND_POD_SELECTORS:
        steps.append(MigStep("wait-pods-deleted", f"Waiting for {what} to shutdown", selector=selector))
    for selector, what in VALIDATOR_POD_SELECTORS:
        steps.append(MigStep("delete-pods", f"Removing the {what} pod", selector=selector))

    if gpu_pods:
        pods = ", ".join(sorted(gpu_pods))
        reason = (
            f"cannot apply MIG config {target.name!r}: the GPUs are in use by another client "
            f"(pods {pods}); the MIG manager does not evict user workloads — cordon the node and "
            "delete them, then set the label again"
        )
        steps.append(MigStep("log", "Applying the MIG mode change from the selected config to the node"))
        steps.append(MigStep("log", f"Error applying MIG configuration: In use by another client ({pods})"))
        steps += _finish(deploy, STATE_FAILED)
        return MigDecision(requested, "failed", STATE_FAILED, reason, current, tuple(steps))

    if (current is not None and current.mig_enabled) != target.mig_enabled:
        steps.append(MigStep("log", "Applying the MIG mode change from the selected config to the node"))
    steps.append(MigStep("apply-mig", "Applying the selected MIG config to the node", layout=target))
    steps.append(MigStep("log", "MIG configuration applied successfully"))
    steps.append(MigStep("delete-pods", "Restarting validator pod to re-run all validations",
                         selector=OPERATOR_VALIDATOR_SELECTOR))
    steps += _finish(deploy, STATE_SUCCESS)
    new_layout = target if target.mig_enabled else None
    return MigDecision(
        requested, "reconfigured", STATE_SUCCESS,
        f"applied MIG config {target.name!r}", new_layout, tuple(steps),
    )
