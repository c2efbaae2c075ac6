"""``gpu-feature-discovery``: the node's GFD labels, kept current.

The labels (:func:`gpulab.fakegpu.gfd.gfd_labels`) follow the GPUs, the MIG
geometry, the device-plugin config (sharing, MIG strategy) and the driver the
node reports (fault ``cuda-driver-too-old`` gives older driver labels); they
are rewritten when one of those changes and every ``GFD_SLEEP_INTERVAL``
(the timestamp label). With the driver not answering (fault
``driver-unreachable``) GFD exits non-zero, as NVIDIA's does.
"""

from __future__ import annotations

import json
import time

from ..._fsutil import file_identity
from ...hardware.models import GpuModelError
from ...kube import api
from .. import gfd
from ..devicemap import DevicePluginError
from ..pluginconfig import DEFAULT_CONFIG, ConfigError, DevicePluginConfig
from .deviceplugin import config_document, load_plugin_config
from .host import RESYNC_S, Host, node_labels

SOURCE = "main.go:152"
#: How soon it looks again after it could not write the labels.
POLL = 1.0


class GfdMain:
    def __init__(self, host: Host):
        self.host = host
        self.out = host.log

    def run(self) -> int:
        out, host = self.out, self.host
        out.info("Starting OS watcher.")
        out.info("Loading configuration.")
        if host.gpus() is None:
            out.info("No GPUs on this node; nothing to label. Waiting indefinitely.")
            while not host.wait(3600):
                pass
            return 0
        seen: object = object()
        config = DEFAULT_CONFIG
        last_write = 0.0
        while True:
            retry = False
            if host.faults().driver_unreachable:
                out.error("Failed to initialize NVML: Driver Not Loaded")
                return 1
            if file_identity(host.settings.config_file) != seen:
                seen = file_identity(host.settings.config_file)
                try:
                    config = load_plugin_config(host)
                except ConfigError as e:
                    out.error(f"unable to load config: {e}")
                    return 1
                out.info("\nRunning with config:\n" + json.dumps(config_document(config), indent=2))
                out.info("Start running")
            try:
                if self._label(config, force=time.monotonic() - last_write >= host.settings.gfd_interval):
                    last_write = time.monotonic()
            except (DevicePluginError, GpuModelError) as e:
                out.error(f"error creating labels: {e}")
                return 1
            except (api.ApiError, api.NotFound, api.Conflict, OSError) as e:
                out.warning(f"error writing labels: {e}; retrying")
                retry = True
            # The config, the MIG geometry, faults and the Node wake it; the timestamp label is due every interval.
            due = host.settings.gfd_interval - (time.monotonic() - last_write)
            if host.wait(POLL if retry else max(POLL, min(RESYNC_S, due))):
                return 0

    def _label(self, config: DevicePluginConfig, force: bool) -> bool:
        host = self.host
        gpus = host.gpus()
        assert gpus is not None
        driver, cuda = host.faults().driver_versions(gfd.DRIVER_VERSION, gfd.CUDA_DRIVER_VERSION)
        want = gfd.gfd_labels(gpus.model, gpus.count, config=config, mig_layout=host.mig_layout(),
                              driver_version=driver, cuda_version=cuda)
        have = {k: v for k, v in node_labels(host).items() if gfd.label_owner(k) == "gfd"}

        def content(labels: dict[str, str]) -> dict[str, str]:
            # GFD rewrites its timestamp label every interval; only the rest is a change.
            return {k: v for k, v in labels.items() if k != gfd.TIMESTAMP_LABEL}

        changed = content(want) != content(have)
        if not changed and not force:
            return False
        patch: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
        patch.update({k: None for k in have if k not in want})
        host.patch_node_labels(patch)
        if changed:
            self.out.info("Creating Labels")
            self.out.info(f"Writing {len(want)} labels to the node")
        return True


def run(host: Host) -> int:
    return GfdMain(host).run()
