"""The node agent's process-wide settings: its interpreter's collector (nodeagent.tune_gc).

Run in a child interpreter: they are the whole process's, and the test process keeps its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gpulab.cluster import nodeagent

PROBE = """
import gc, json, threading
from gpulab.cluster import nodeagent
before = gc.get_freeze_count()
nodeagent.tune_gc()
print(json.dumps({"thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count() - before,
                  "collector": [t.name for t in threading.enumerate() if t.name == "gc-full" and t.daemon]}))
"""


def test_the_node_agent_freezes_what_it_built_and_collects_the_whole_heap_on_a_timer():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    got = json.loads(out.stdout)
    assert tuple(got["thresholds"]) == nodeagent.GC_THRESHOLDS
    assert got["thresholds"][2] >= 10**6           # no full collection as the heap grows ...
    assert got["collector"] == ["gc-full"]          # ... a daemon thread collects it every FULL_GC_S
    assert got["frozen"] > 1000                     # the modules and objects built at start are never traced again
