"""A pretend training run: reads the dataset, trains STEPS steps, checkpoints after each one.

Environment: DATA_DIR (default /data) holds the dataset an initContainer prepared;
CKPT_DIR (default /ckpt) holds checkpoint.json. The first attempt hits a simulated
GPU fault (Xid 79) at step FAIL_AT_STEP and exits 1; a marker file next to the
checkpoint remembers that the fault has happened, like a flaky card that was
replaced. A later attempt that finds the checkpoint resumes from it.
"""

import json
import os
import sys
import time

DATA = os.environ.get("DATA_DIR", "/data")
CKPT = os.environ.get("CKPT_DIR", "/ckpt")
STEPS = int(os.environ.get("STEPS", "6"))
FAIL_AT = int(os.environ.get("FAIL_AT_STEP", "3"))

shards = sorted(os.listdir(DATA)) if os.path.isdir(DATA) else []
if not shards:
    print(f"dataset not found: {DATA} is empty (did the initContainer prepare it?)", flush=True)
    sys.exit(2)
print(f"dataset: {len(shards)} shards in {DATA}", flush=True)

os.makedirs(CKPT, exist_ok=True)
state_file = os.path.join(CKPT, "checkpoint.json")
marker = os.path.join(CKPT, ".fault-injected")
start = 0
if os.path.exists(state_file):
    with open(state_file) as f:
        start = json.load(f)["step"]
    print(f"resumed from checkpoint at step {start}", flush=True)
else:
    print("no checkpoint found, starting from step 0", flush=True)

loss = 2.0 / (1 + start)
for step in range(start + 1, STEPS + 1):
    time.sleep(0.2)
    loss = 2.0 / (1 + step)
    tmp = state_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "loss": round(loss, 4)}, f)
    os.replace(tmp, state_file)
    print(f"step {step}/{STEPS} loss={loss:.4f} checkpoint saved", flush=True)
    if step == FAIL_AT and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write("fault injected once\n")
        print("simulated GPU fault: Xid 79, GPU has fallen off the bus; exiting", file=sys.stderr, flush=True)
        sys.exit(1)
print(f"training complete: {STEPS} steps, final loss {loss:.4f}", flush=True)
