"""gpulab: a course on GPU and AI workloads on Kubernetes, with fake NVIDIA GPUs.

The library behind the ``gpulab`` command, the lesson notebooks, the labs and
the quizzes; the Kubernetes control plane it runs is real, the GPUs and the
kubelet's node side are simulated. Its parts, top layer first (each imports
only those below it; DEVELOPMENT.md's "Layout" has the picture):

- ``gpulab.cli``       the ``gpulab`` command, a thin layer over the rest
- ``gpulab.notebook``  the lesson library (``from gpulab.notebook import *``)
- ``gpulab.grading``   checks, the papermill runner and jail, the gradebook, learner dist
- ``gpulab.quiz``      question banks rendered as widgets, local progress
- ``gpulab.cluster``   bring-up: the embedded and kind backends, the node agent's entry point
- ``gpulab.fakegpu``   everything NVIDIA: device plugin, GFD, MIG, nvidia-smi, DCGM, operator
- ``gpulab.runtime``   the simulated kubelet: pods, containers, sandbox, pod network
- ``gpulab.usage``     GPU-hours by PromQL over the monitoring add-on's Prometheus: reports and plots
- ``gpulab.kube``      API client, Events, PKI, kubeconfigs, state directory, topology, names
- ``gpulab.hardware``  GPU models and MIG profiles as data (models.yaml)

and small modules that import nothing from gpulab: ``paths`` (state and caches),
``versions`` (pinned component versions), ``marks`` (verdict symbols),
``_poll`` (polling for waits), ``_fsutil`` (atomic writes, locks) and ``_proc``
(processes known by pid and start time).
"""

__version__ = "0.1.0"
