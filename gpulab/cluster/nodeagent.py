"""The node agent's entry point: the simulated kubelet with the GPU side plugged in.

``python -m gpulab.cluster.nodeagent --cluster-dir DIR`` is what the embedded
cluster starts as its ``node-agent`` component. It composes the two halves that
know nothing of each other: the pod runner (:class:`gpulab.runtime.agent.NodeAgent`)
and the GPU stack (:class:`gpulab.fakegpu.stack.GpuStack`), which takes part in
each pod's life through :class:`gpulab.runtime.devices.DeviceHooks`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from ..fakegpu.stack import GpuStack
from ..runtime.agent import NodeAgent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.cluster.nodeagent",
                                     description="gpulab's simulated kubelet for the embedded cluster")
    parser.add_argument("--cluster-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # The GPU side of every GPU node: device managers, GPUs, NVIDIA's programs.
    gpus = GpuStack(args.cluster_dir)
    agent = NodeAgent(args.cluster_dir, devices=gpus)

    def on_term(signum, frame):
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    gpus.start()
    try:
        agent.run(ready_file=args.cluster_dir / "node-agent.ready")
    finally:
        gpus.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
