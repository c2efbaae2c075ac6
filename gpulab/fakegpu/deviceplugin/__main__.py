"""Run the fake NVIDIA device plugin.

    python -m gpulab.fakegpu.deviceplugin --inventory FILE --plugin-dir DIR \\
        --nvidia-smi PATH [--state-dir DIR] [--dev-root DIR] [--no-device-specs]

SIGTERM/SIGINT stop it (its sockets are removed); SIGHUP restarts every
server and re-registers, as NVIDIA's plugin does after a config change.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from . import DEVICE_PLUGIN_PATH
from .plugin import DevicePlugin, InventoryError, PluginConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpulab.fakegpu.deviceplugin", description="Run the fake NVIDIA device plugin."
    )
    parser.add_argument("--inventory", required=True, type=Path, help="inventory JSON file (watched for changes)")
    parser.add_argument("--plugin-dir", type=Path, default=Path(DEVICE_PLUGIN_PATH),
                        help="device-plugin directory holding kubelet.sock (default: %(default)s)")
    parser.add_argument("--nvidia-smi", required=True, type=Path,
                        help="host path of the fake nvidia-smi mounted into containers")
    parser.add_argument("--state-dir", type=Path, help="where per-allocation nvidia-smi state files are written "
                        "(default: <plugin-dir>/gpulab-nvidia-smi)")
    parser.add_argument("--dev-root", type=Path, default=Path("/dev"),
                        help="host directory with nvidia<N>, nvidiactl, nvidia-uvm (default: %(default)s)")
    parser.add_argument("--no-device-specs", dest="pass_device_specs", action="store_false",
                        help="do not pass /dev/nvidia* device specs to containers")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between inventory/socket checks")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
    )
    log = logging.getLogger("gpulab.fakegpu.deviceplugin")
    config = PluginConfig(
        plugin_dir=args.plugin_dir,
        nvidia_smi=args.nvidia_smi,
        state_dir=args.state_dir,
        dev_root=args.dev_root,
        pass_device_specs=args.pass_device_specs,
        poll_interval=args.poll_interval,
    )
    plugin = DevicePlugin(config, inventory_path=args.inventory)

    wake = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        wake.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    try:
        plugin.start()
    except InventoryError as err:
        log.error("Invalid inventory: %s", err)
        return 1
    try:
        while True:
            if not wake.wait(timeout=1.0):
                continue
            wake.clear()
            while received:
                signum = received.pop(0)
                if signum == signal.SIGHUP:
                    log.info("Received signal %s, restarting all plugins", signal.Signals(signum).name)
                    plugin.restart()
                else:
                    log.info("Received signal %s, shutting down", signal.Signals(signum).name)
                    return 0
    finally:
        plugin.stop()


if __name__ == "__main__":
    sys.exit(main())
