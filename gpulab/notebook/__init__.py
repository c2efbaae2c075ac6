"""What the chapter notebooks call: one ``setup`` to get a lesson ready, and small helpers.

Every notebook's first code cell is::

    from gpulab.notebook import *
    lab = setup("03-scheduling",
                node_labels=["node-role.kubernetes.io/ai"],   # what this lesson changes on nodes
                node_taints=["nvidia.com/gpu"])

``setup`` makes the kernel behave like a terminal set up for the course (the
repository root as working directory, the virtualenv's ``bin`` first on
``PATH``, a ``KUBECONFIG`` whose context defaults to the lesson's namespace),
starts the cluster if it is not running, and starts the lesson from a clean
state; ``lab.reset()`` (or :func:`reset_lesson`) at the end of a notebook
undoes what the lesson changed, so notebooks run in any order
(:mod:`gpulab.notebook.lesson` says exactly what).

Helpers, all usable after ``from gpulab.notebook import *``:

=====================  ==========================================================
``sh(cmd)``            run a shell command, print ``$ cmd`` and its output, return it
``apply(path)``        ``kubectl apply -f`` a manifest of the repository
``show_manifest(p)``   display a manifest file (lessons show YAML by reading it)
``wait_for(fn)``       poll until ``fn()`` is truthy; ``wait_pods``/``wait_job`` wrap it
``events(obj)``        the events of an object, oldest first, as a table
``endpoints(svc)``     a Service's endpoints and whether each is ready for traffic
``follow_logs(pod)``   keep a pod's log while it runs (a deleted pod's log is gone)
``pending_reason(p)``  the scheduler's message for a Pending pod
``pods()``/``placements()``  where the lesson's pods landed, and why not
``nodes()``            nodes with GPU model, allocatable and used GPUs, taints
``gpu_pods()``         pods that request GPUs (the chapter's ``jq`` listing)
``remove_image(n, i)`` take an image off a node, as ``crictl rmi`` there (a cold start next time)
``plot_allocation()``  nvidia.com/gpu per node: who holds which card count
``plot_free_gpus()``   free GPUs per node under each set-up (fragmentation vs bin-packing)
``plot_card_memory()`` how model replicas fit in a card's memory, per sharing scheme
``plot_gpu_memory()``  what the pods on each physical GPU asked of its memory, and who failed
``plot_latency()``     p50 and p99 latency of the same requests under each set-up
``watch_pods()``       record pod states over time; ``.plot()`` draws a timeline
``expect(ok, what)``   a lesson's self-check: prints ✓, or fails the cell with ×
``show_quiz(s)``       the section's quiz (from :mod:`gpulab.quiz`)
=====================  ==========================================================

Tables are :class:`Table` objects: a list of dict rows that renders as HTML in
JupyterLab and as aligned text elsewhere (CJK characters count double).

The package has one module per noun; each imports only the ones listed before it
(tests/notebooks/test_notebook_lib.py checks it):

- ``table``: :class:`Table`; ``shell``: ``sh``, ``have``, ``REPO``; ``wait``: ``wait_for``;
  ``quantity``: Kubernetes quantities as numbers; ``checks``: ``expect``; ``quiz``: ``show_quiz``;
- ``manifest``: ``apply``, ``delete``, ``show_manifest``;
- ``lesson``: ``setup``, :class:`Lab` and its reset, ``reset_lesson``, the current lesson;
- ``pod``: ``pods``, ``pod_status``, ``pod_gpus``, ``pending_reason``, ``placements``, ``wait_pods``;
  ``job``: ``wait_job``; ``event``: ``events``; ``service``: ``endpoints``; ``logs``: ``follow_logs``;
- ``gpus``: ``gpu_allocation``, ``nodes``, ``gpu_pods``; ``images``: ``remove_image``;
- ``plots``: the ``plot_*`` figures, matplotlib and CJK fonts (imported when a figure is drawn);
- ``timeline``: ``watch_pods``; ``hpa``: ``watch_hpa``; ``metrics``: ``dcgm_metrics``,
  ``custom_metrics``; ``usage``: ``usage_report``, ``wait_scrape`` (PromQL over the monitoring add-on).
"""

from __future__ import annotations

from .checks import expect
from .event import events
from .gpus import gpu_allocation, gpu_pods, nodes
from .hpa import HpaTimeline, watch_hpa
from .images import remove_image
from .job import wait_job
from .lesson import Changes, Lab, reset_lesson, setup
from .logs import LogFollower, follow_logs
from .manifest import apply, delete, show_manifest
from .metrics import custom_metrics, dcgm_metrics
from .plots import plot_allocation, plot_card_memory, plot_free_gpus, plot_gpu_memory, plot_latency
from .pod import GPU, pending_reason, placements, pod_gpus, pod_status, pods, wait_pods
from .quiz import show_quiz
from .service import endpoints
from .shell import REPO, CommandFailed, Output, have, sh
from .table import Table
from .timeline import Timeline, watch_pods
from .usage import UsageReport, usage_report, wait_scrape
from .wait import wait_for

__all__ = [
    # the lesson
    "setup", "reset_lesson", "Lab",
    # shell and manifests
    "sh", "have", "apply", "delete", "show_manifest", "Output", "CommandFailed",
    # waiting and reading the cluster
    "wait_for", "wait_pods", "wait_job", "pods", "pod_status", "pod_gpus", "pending_reason", "placements", "nodes",
    "gpu_pods", "gpu_allocation", "events", "endpoints", "follow_logs", "LogFollower", "remove_image",
    # showing
    "Table", "plot_allocation", "plot_card_memory", "plot_free_gpus", "plot_gpu_memory", "plot_latency", "watch_pods",
    "Timeline",
    # checking
    "expect", "show_quiz", "Changes", "GPU", "REPO",
    # monitoring and cost
    "dcgm_metrics", "custom_metrics", "watch_hpa", "HpaTimeline", "usage_report", "UsageReport", "wait_scrape",
]
