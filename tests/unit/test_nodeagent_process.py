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


FUTEX_PROBE = """
import ctypes, json, threading, time
from gpulab.cluster import nodeagent
threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(4)]
for t in threads:
    t.start()
slots = nodeagent.widen_futex_hash(1000)
got = ctypes.CDLL(None).prctl(78, 2, 0, 0, 0)   # PR_FUTEX_HASH, PR_FUTEX_HASH_GET_SLOTS
print(json.dumps({"slots": slots, "got": got, "small": nodeagent.widen_futex_hash(3)}))
"""


def test_the_node_agents_futex_hash_has_a_slot_per_thread_of_its_fleet():
    out = subprocess.run([sys.executable, "-c", FUTEX_PROBE], capture_output=True, text=True, check=True, timeout=60)
    got = json.loads(out.stdout)
    if got["slots"] == 0:                      # a kernel before 6.16: one hash for the machine, nothing to set
        assert got["got"] == -1
        return
    assert got["slots"] == got["got"] == 16384  # 1000 nodes x FUTEX_SLOTS_PER_NODE, to a power of two
    assert got["small"] == 1024                 # never fewer than 1024
