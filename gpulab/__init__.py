"""gpulab: a course on GPU and AI workloads on Kubernetes, with fake NVIDIA GPUs.

The package is the support library behind the notebooks and labs:

- ``gpulab.cluster``  bring-up of the embedded control plane and its simulated nodes
- ``gpulab.runtime``  the simulated kubelet: runs pods' commands in a sandbox
- ``gpulab.fakegpu``  GPU models, device plugin, GFD labels, MIG, nvidia-smi, DCGM
- ``gpulab.grading``  papermill-executed checks and the gradebook
- ``gpulab.quiz``     question banks rendered as widgets, local progress
"""

__version__ = "0.1.0"
