"""An inference server that answers: the program of the ``gpulab/llm-server`` image.

Runs inside pods with the host's ``/usr/bin/python3``, so it is standard
library only and imports nothing from gpulab (like :mod:`gpulab.fakegpu.nvidiasmi`);
the node agent mounts this file at ``/usr/local/bin/llm-server`` and a container
of the image without ``command`` runs ``python3 /usr/local/bin/llm-server ARGS``.
Nothing here computes a model and **no weights are ever downloaded**: what is
real is the serving — HTTP, readiness while the weights load, a queue in front
of a fixed number of concurrent requests, latency that depends on the share of
the GPU the container has, Prometheus metrics and access logs.

Subcommands (``serve`` when none is given):

``serve --model DIR [--port 8000] [--max-concurrency 8] [--load-gib-per-second 2] [--ms-per-token 10]``
    Loads the model (takes ``size_gib / load-gib-per-second`` seconds) while
    already listening; serves ``GET /health`` (503 while loading, 200 after),
    ``GET /v1/models``, ``POST /v1/completions`` (OpenAI's JSON) and
    ``GET /metrics`` (Prometheus text). A completion of ``max_tokens`` tokens
    computes for ``max_tokens × ms_per_token / share`` ms, where ``share`` is
    the part of a GPU the container has now (below); at most
    ``--max-concurrency`` compute at once, the others wait in a queue. On
    SIGTERM it closes its listener (new connections are refused, as uvicorn
    does), finishes what it accepted and exits 0.
``fetch --name NAME --size-gib N --to DIR [--parameters 7B] [--mib-per-second 500]``
    Writes a model directory, taking the time a download of that size would
    and printing progress: what an init container or a Job runs to fill a
    model-cache volume. A directory that already holds the model is kept.
``loadgen URL [--rps 5] [--duration 30] [--timeout 10] [--max-tokens 16]``
    Sends completions to ``URL`` at a fixed rate (open loop: a slow server
    does not slow the sender) for ``--duration`` seconds (0: until SIGTERM or
    Ctrl-C); prints one line per second (sent, ok, failed by kind, p50/p99 of
    the answers in that second) and, last, one line of JSON with the totals
    (:func:`summary_line`).

The model directory (``fetch`` writes it, ``serve`` reads it)::

    DIR/model.json   {"format": "gpulab.llm-model/v1", "name": "llama-7b",
                      "parameters": "7B", "size_gib": 14.0, "fetched_at": "…"}

``name`` (non-empty) and ``size_gib`` (a positive number) are required. The
weights' bytes are not there: the size is declared, and the load time follows
from it.

The compute share, read every 0.5 s from the nvidia-smi state file the node
agent keeps current (``GPULAB_NVIDIA_SMI_STATE``, schema in
:mod:`gpulab.fakegpu.nvidiasmi`) for the device ``NVIDIA_VISIBLE_DEVICES`` names:

- a MIG device: its SMs over the whole GPU's (a 1g slice of an H100: 16/132);
  the neighbours in other slices do not matter, that is MIG's isolation;
- a whole GPU: the neighbours' busy fraction ``n = min(1, neighbours / 100)``,
  where ``neighbours`` is what the other programs on the card want of it
  (``utilization_neighbours``, which the node agent writes into each
  container's own file; a program that fixes its utilization, such as a
  training job's 100 %, wants that much) — or, in a file without it,
  ``utilization_gpu`` less ``own``, what this server had reported (below)
  when the node wrote the file —, and time-slicing gives ``1 / (1 + n)``: a
  fully busy neighbour doubles latency;
- no state file (a container without a GPU): 1, said once in the log.

A neighbour that is itself slowed by this server reports what it got, not
what it wanted, so two saturated servers on one card slow each other a
little less than real ones would; a neighbour with a fixed utilization (the
common case: a training job) is exact.

The server's own GPU utilization goes back to the node through the file named
by ``GPULAB_GPU_ACTIVITY`` (:data:`ACTIVITY_ENV`; the node agent gives each GPU
container one, in a directory of its own mounted read-write): every second the
server replaces it with one integer, the percent of its device's compute it
used in the last second — the time during which at least one request was
computing (nvidia-smi's ``utilization.gpu``: the percent of time one or more
kernels ran), times its time slice when it shares a whole GPU in time (a MIG
device's percent is of the device itself, as the node's ledger counts it). The
node agent reads it as a measured utilization
(:meth:`gpulab.fakegpu.node.GpuNode.apply_load`), so nvidia-smi and the DCGM
exporter show the traffic that really flows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Env var naming the file the server writes its busy percent to (the node agent sets it).
ACTIVITY_ENV = "GPULAB_GPU_ACTIVITY"
STATE_ENV = "GPULAB_NVIDIA_SMI_STATE"
VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
MODEL_FORMAT = "gpulab.llm-model/v1"
MODEL_FILE = "model.json"
#: The image whose program this is (any tag), and where the node agent mounts this file in its containers.
IMAGE_REPOSITORY = "gpulab/llm-server"
#: The image as the lessons name it (and as the kind backend builds it, images/llm-server/Dockerfile).
IMAGE = f"{IMAGE_REPOSITORY}:0.1"
CONTAINER_PATH = "/usr/local/bin/llm-server"
SERVED_BY = "X-Served-By"  # response header: the hostname of the replica that answered
HOSTNAME = socket.gethostname()

#: Latency histogram buckets, seconds (a token is milliseconds; a long completion tens of seconds).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MAX_TOKENS_LIMIT = 4096
STATE_PERIOD = 0.5
ACTIVITY_PERIOD = 1.0
# Threads are many and small (one per connection, one per loadgen request); a container's
# address-space limit (2 GiB by default) would not hold hundreds of 8 MiB stacks.
THREAD_STACK = 512 * 1024

_FILLER = ("the", "model", "answers", "with", "tokens", "that", "cost", "time", "on", "a", "gpu",
           "shared", "or", "alone", "and", "each", "one", "takes", "its", "turn")

_print_lock = threading.Lock()


def say(line: str, stream=None) -> None:
    """One log line, whole, flushed at once (the container's log is read while it runs)."""
    with _print_lock:
        print(line, file=stream or sys.stdout, flush=True)


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --------------------------------------------------------------------------
# The model directory


class ModelError(Exception):
    """A model directory ``serve`` cannot use; the message says what, where and what is expected."""


def read_model(directory: str) -> dict:
    """The model directory's ``model.json``, checked. Raises :class:`ModelError`."""
    path = os.path.join(directory, MODEL_FILE)
    expected = (f'expected {path} with {{"name": "...", "size_gib": N}} '
                f"(write one with: llm-server fetch --name NAME --size-gib N --to {directory})")
    if not os.path.isdir(directory):
        raise ModelError(f"model directory {directory} does not exist; {expected}")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise ModelError(f"model directory {directory} has no {MODEL_FILE}; {expected}") from None
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ModelError(f"{path} is not valid JSON ({exc}); {expected}") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: the top level must be an object; {expected}")
    fmt = doc.get("format", MODEL_FORMAT)
    if fmt != MODEL_FORMAT:
        raise ModelError(f"{path}: format {fmt!r} is not {MODEL_FORMAT!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ModelError(f"{path}: 'name' must be a non-empty string; {expected}")
    size = doc.get("size_gib")
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
        raise ModelError(f"{path}: 'size_gib' must be a positive number of GiB, not {size!r}; {expected}")
    return {**doc, "name": name.strip(), "size_gib": float(size)}


def fetch(name: str, size_gib: float, to: str, parameters: str | None = None,
          mib_per_second: float = 500.0, out=None) -> bool:
    """Write a model directory, taking a download's time; False when it already held the model.

    ``model.json`` is written last (atomically), so a fetch killed halfway
    leaves a directory that ``serve`` refuses, as a partial download would be.
    """
    out = out or sys.stdout
    try:
        have = read_model(to)
    except ModelError:
        have = None
    if have is not None and have["name"] == name and abs(have["size_gib"] - size_gib) < 1e-9:
        print(f"{name} ({size_gib:.1f} GiB) is already in {to}: nothing to download", file=out, flush=True)
        return False
    os.makedirs(to, exist_ok=True)
    total_mib = size_gib * 1024
    seconds = total_mib / mib_per_second if mib_per_second > 0 else 0.0
    print(f"downloading {name} ({size_gib:.1f} GiB) to {to} at {mib_per_second:g} MiB/s", file=out, flush=True)
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        done = total_mib if seconds <= 0 else min(total_mib, total_mib * elapsed / seconds)
        print(f"  {done:8.0f} / {total_mib:.0f} MiB  {100 * done / total_mib:3.0f}%  {elapsed:5.1f} s",
              file=out, flush=True)
        if done >= total_mib:
            break
        time.sleep(min(1.0, max(0.0, seconds - elapsed)))
    write_model(to, name, size_gib, parameters)
    print(f"fetched {name} into {to} in {time.monotonic() - start:.1f} s", file=out, flush=True)
    return True


def write_model(to: str, name: str, size_gib: float, parameters: str | None = None) -> None:
    """Write ``to/model.json`` (atomically): what ``fetch`` leaves, and what an image with the weights baked in holds."""
    os.makedirs(to, exist_ok=True)
    path = os.path.join(to, MODEL_FILE)
    doc = {"format": MODEL_FORMAT, "name": name, "parameters": parameters, "size_gib": size_gib,
           "fetched_at": _stamp()}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# The compute share


def compute_share(state: dict | None, visible: str | None, own_percent: float = 0.0) -> tuple[float, str]:
    """``(share, why)``: the part of a GPU this container computes with now (see the module docstring)."""
    return device_share(state, visible, own_percent)[:2]


def device_share(state: dict | None, visible: str | None, own_percent: float = 0.0) -> tuple[float, str, bool]:
    """:func:`compute_share` and whether the device is a whole GPU shared in time (False: MIG, or no GPU)."""
    if state is None:
        return 1.0, "no GPU state file: compute share 1 (no GPU to share)", False
    entries = [e.strip().split("::", 1)[0] for e in (visible or "").split(",") if e.strip()]
    gpus = state.get("gpus") or []
    if not entries or entries[0] in ("none", "void"):
        return 1.0, f"no GPU visible ({VISIBLE_ENV}={visible or ''}): compute share 1", False
    if entries[0] == "all":
        entries = [g.get("uuid", "") for g in gpus]
    shares: list[tuple[float, str, bool]] = []
    for entry in entries:
        found = _find_device(gpus, entry)
        if found is None:
            continue
        gpu, mig = found
        if mig is not None:
            whole = _whole_gpu_sms(gpu)
            sm = float(mig.get("sm") or 0)
            if whole > 0 and sm > 0:
                share = min(1.0, sm / whole)
                shares.append((share, f"MIG {mig.get('profile', '?')} {mig.get('uuid', entry)}: "
                                      f"{sm:.0f} of {whole:.0f} SMs, compute share {share:.2f}", False))
            continue
        if "utilization_neighbours" in gpu:
            busy = max(0.0, float(gpu["utilization_neighbours"] or 0)) / 100
        else:
            busy = max(0.0, float(gpu.get("utilization_gpu") or 0) - own_percent) / 100
        share = 1.0 / (1.0 + min(1.0, busy))
        shares.append((share, f"GPU {gpu.get('uuid', entry)} ({gpu.get('name', '?')}): neighbours "
                              f"{100 * busy:.0f}% busy, compute share {share:.2f}", True))
    if not shares:
        return 1.0, f"{VISIBLE_ENV}={visible} names no device of the state file: compute share 1", False
    # Work spread over several devices waits for the slowest.
    return min(shares)


def _find_device(gpus: list, entry: str) -> tuple[dict, dict | None] | None:
    for pos, gpu in enumerate(gpus):
        if entry == gpu.get("uuid") or entry == str(gpu.get("index", pos)):
            return gpu, None
        for mig in gpu.get("mig_devices") or []:
            if entry == mig.get("uuid") or entry == f"{gpu.get('index', pos)}:{mig.get('index', 0)}":
                return gpu, mig
    return None


def _whole_gpu_sms(gpu: dict) -> float:
    """The whole GPU's SMs: those of its full-size MIG profile (7g on an H100)."""
    slices = gpu.get("mig_compute_slices")
    profiles = gpu.get("mig_profiles") or []
    full = [p for p in profiles if slices and p.get("g") == slices and p.get("sm")]
    if full:
        return float(full[0]["sm"])
    return float(max((p.get("sm") or 0 for p in profiles), default=0))


def read_state(path: str) -> dict | None:
    """The nvidia-smi state file, or None when there is none (a container without a GPU)."""
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def latency_seconds(max_tokens: int, ms_per_token: float, share: float) -> float:
    """How long a completion computes: ``max_tokens × ms_per_token / share``."""
    return max_tokens * ms_per_token / 1000.0 / max(share, 1e-3)


# --------------------------------------------------------------------------
# Metrics, written by hand in Prometheus' text format


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}
        self.buckets = [0] * len(BUCKETS)
        self.count = 0
        self.sum = 0.0
        self.tokens = 0

    def observe(self, endpoint: str, code: int, seconds: float | None = None, tokens: int = 0) -> None:
        with self.lock:
            key = (endpoint, str(code))
            self.requests[key] = self.requests.get(key, 0) + 1
            self.tokens += tokens
            if seconds is not None:
                self.count += 1
                self.sum += seconds
                for i, le in enumerate(BUCKETS):
                    if seconds <= le:
                        self.buckets[i] += 1

    def render(self, server: "LlmServer") -> str:
        with self.lock:
            lines = ["# HELP llm_requests_total API requests answered, by endpoint and HTTP status code.",
                     "# TYPE llm_requests_total counter"]
            for (endpoint, code), n in sorted(self.requests.items()):
                lines.append(f'llm_requests_total{{endpoint="{endpoint}",code="{code}"}} {n}')
            lines += ["# HELP llm_request_duration_seconds Completion latency, queueing included.",
                      "# TYPE llm_request_duration_seconds histogram"]
            for le, n in zip(BUCKETS, self.buckets):
                lines.append(f'llm_request_duration_seconds_bucket{{le="{le}"}} {n}')
            lines += [f'llm_request_duration_seconds_bucket{{le="+Inf"}} {self.count}',
                      f"llm_request_duration_seconds_sum {self.sum:.6f}",
                      f"llm_request_duration_seconds_count {self.count}",
                      "# HELP llm_generated_tokens_total Tokens generated.",
                      "# TYPE llm_generated_tokens_total counter",
                      f"llm_generated_tokens_total {self.tokens}"]
        gauges = (("llm_requests_in_flight", "Requests computing now.", server.in_flight),
                  ("llm_requests_queued", "Requests waiting for a free slot.", server.queued),
                  ("llm_model_loaded", "1 once the weights are loaded.", int(server.loaded.is_set())),
                  ("llm_compute_share", "Part of a GPU this server computes with now.", server.share),
                  ("llm_gpu_busy_percent", "Percent of the last second with a request computing.",
                   server.busy_percent))
        for name, text, value in gauges:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# The server


class LlmServer:
    """The serving state: the model, the queue and slots, the share, the busy time."""

    def __init__(self, model: dict, model_dir: str, max_concurrency: int = 8, load_gib_per_second: float = 2.0,
                 ms_per_token: float = 10.0, env: dict | None = None):
        self.model = model
        self.model_dir = model_dir
        self.max_concurrency = max_concurrency
        self.load_gib_per_second = load_gib_per_second
        self.ms_per_token = ms_per_token
        self.env = dict(os.environ if env is None else env)
        self.loaded = threading.Event()
        self.stopping = threading.Event()
        self.drained = threading.Event()
        self.created = int(time.time())
        self.slots = threading.BoundedSemaphore(max_concurrency)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.queued = 0
        self.share = 1.0
        self.share_why = ""
        self.time_sliced = False
        self.busy_percent = 0
        self._reports: list[tuple[float, int]] = []  # (wall time, percent) of the last reports
        self._busy_since: float | None = None
        self._busy_accum = 0.0
        self.metrics = Metrics()
        self.httpd: ThreadingHTTPServer | None = None

    # -- loading, share, activity ------------------------------------------------

    def load(self) -> None:
        size = self.model["size_gib"]
        seconds = size / self.load_gib_per_second if self.load_gib_per_second > 0 else 0.0
        start = time.monotonic()
        if self.stopping.wait(seconds):
            return  # told to stop while loading
        self.loaded.set()
        say(f"model loaded in {time.monotonic() - start:.1f} s")

    def update_share(self) -> None:
        path = self.env.get(STATE_ENV)
        state = read_state(path) if path else None
        if state is None and path:
            # Unreadable for a moment (or gone): keep the last share rather than jump to 1.
            if self.share_why:
                return
        share, why, self.time_sliced = device_share(state, self.env.get(VISIBLE_ENV), self._own_at(path))
        previous, self.share = self.share, share
        if not self.share_why or abs(previous - share) >= 0.05:
            say(why)
        self.share_why = why

    def _own_at(self, path: str | None) -> float:
        """What this server had reported when the node wrote the state file: that is in its utilization."""
        try:
            written = os.stat(path).st_mtime if path else time.time()
        except OSError:
            written = time.time()
        own = 0.0
        for at, percent in self._reports:
            if at <= written:
                own = percent
        return own

    def _busy_edge(self, delta: int) -> None:
        now = time.monotonic()
        with self.lock:
            if delta > 0 and self.in_flight == 0:
                self._busy_since = now
            self.in_flight += delta
            if delta < 0 and self.in_flight == 0 and self._busy_since is not None:
                self._busy_accum += now - self._busy_since
                self._busy_since = None

    def sample_busy(self, window: float) -> int:
        """Percent of its device's compute used in the last ``window`` seconds: the time at least one request
        computed, times the time slice it had of a whole GPU shared in time (a MIG device is all its own)."""
        now = time.monotonic()
        with self.lock:
            busy = self._busy_accum
            if self._busy_since is not None:
                busy += now - self._busy_since
                self._busy_since = now
            self._busy_accum = 0.0
        slice_ = self.share if self.time_sliced else 1.0
        self.busy_percent = max(0, min(100, int(round(100 * busy / window * slice_))))
        return self.busy_percent

    def write_activity(self) -> None:
        path = self.env.get(ACTIVITY_ENV)
        if not path:
            return
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(f"{self.busy_percent}\n")
            os.replace(tmp, path)
            self._reports = (self._reports + [(time.time(), self.busy_percent)])[-20:]
        except OSError as exc:
            say(f"cannot report GPU activity to {path}: {exc.strerror}; the node will not see this traffic",
                sys.stderr)
            self.env.pop(ACTIVITY_ENV, None)

    def background(self) -> None:
        """Read the share every 0.5 s, sample and report the busy percent every second."""
        last = time.monotonic()
        while not self.stopping.wait(STATE_PERIOD):
            self.update_share()
            now = time.monotonic()
            if now - last >= ACTIVITY_PERIOD:
                self.sample_busy(now - last)
                self.write_activity()
                last = now

    # -- requests -----------------------------------------------------------------

    def complete(self, max_tokens: int) -> tuple[float, float]:
        """Wait for a slot, compute ``max_tokens``; returns (queued seconds, computing seconds)."""
        t0 = time.monotonic()
        with self.lock:
            self.queued += 1
        self.slots.acquire()
        with self.lock:
            self.queued -= 1
        t1 = time.monotonic()
        self._busy_edge(+1)
        try:
            # The share may change while it computes (a neighbour starts): progress at the current rate.
            remaining = latency_seconds(max_tokens, self.ms_per_token, 1.0)
            while remaining > 1e-6:
                share = max(self.share, 1e-3)
                step = min(0.05, remaining / share)
                time.sleep(step)
                remaining -= step * share
        finally:
            self._busy_edge(-1)
            self.slots.release()
        return t1 - t0, time.monotonic() - t1

    def text(self, prompt: str, max_tokens: int) -> str:
        seed = zlib.crc32(prompt.encode("utf-8"))
        return " " + " ".join(_FILLER[(seed + i) % len(_FILLER)] for i in range(max_tokens))

    def drain(self, grace: float = 30.0) -> None:
        """SIGTERM: stop accepting, let what was accepted finish, stop."""
        with self.lock:
            busy = self.in_flight + self.queued
        say(f"SIGTERM: closing the listener, finishing {busy} request(s)")
        self.stopping.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with self.lock:
                if self.in_flight + self.queued == 0:
                    break
            time.sleep(0.05)
        say("bye")
        self.drained.set()


class Handler(BaseHTTPRequestHandler):
    server_version = "llm-server/1"
    protocol_version = "HTTP/1.1"
    app: LlmServer  # set on the subclass each server makes

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass  # one line per request is ours (_log)

    def _log(self, code: int, extra: str = "") -> None:
        # Probes every second would bury the completions: successful checks are not logged
        # (as many servers filter their health-check access logs).
        if code == 200 and self.path in ("/health", "/metrics"):
            return
        say(f'{_stamp()} {self.client_address[0]} "{self.command} {self.path}" {code}{extra}')

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        # Which replica answered (its pod's hostname): behind a Service, a client can count the replicas.
        self.send_header(SERVED_BY, HOSTNAME)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, doc: dict) -> None:
        self._send(code, (json.dumps(doc) + "\n").encode())

    def _error(self, code: int, message: str, kind: str = "invalid_request_error", endpoint: str = "") -> None:
        self._json(code, {"error": {"message": message, "type": kind, "code": code}})
        if endpoint:
            self.app.metrics.observe(endpoint, code)
        self._log(code, f" error={message!r}")

    def _loading(self, endpoint: str) -> bool:
        if self.app.loaded.is_set():
            return False
        self._error(503, f"model {self.app.model['name']} is still loading", "service_unavailable", endpoint)
        return True

    def do_GET(self) -> None:
        app = self.app
        if self.path == "/health":
            code = 200 if app.loaded.is_set() and not app.stopping.is_set() else 503
            body = b"" if code == 200 else b"stopping\n" if app.stopping.is_set() else b"loading\n"
            self._send(code, body, "text/plain")
            self._log(code)
        elif self.path == "/metrics":
            self._send(200, app.metrics.render(app).encode(), "text/plain; version=0.0.4; charset=utf-8")
            self._log(200)
        elif self.path == "/v1/models":
            if self._loading("/v1/models"):
                return
            self._json(200, {"object": "list", "data": [{
                "id": app.model["name"], "object": "model", "created": app.created, "owned_by": "gpulab",
                "root": app.model_dir, "parent": None}]})
            app.metrics.observe("/v1/models", 200)
            self._log(200)
        else:
            self._error(404, f"no route GET {self.path}", "not_found")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        app = self.app
        endpoint = "/v1/completions"
        if self.path != endpoint:
            self._error(404, f"no route POST {self.path}", "not_found")
            return
        start = time.monotonic()
        try:
            length = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._error(400, f"the body is not JSON: {exc}", endpoint=endpoint)
            return
        if self._loading(endpoint):
            return
        if not isinstance(req, dict):
            self._error(400, "the body must be a JSON object", endpoint=endpoint)
            return
        model = req.get("model", app.model["name"])
        if model != app.model["name"]:
            self._error(404, f"The model `{model}` does not exist (this server serves {app.model['name']}).",
                        "NotFoundError", endpoint)
            return
        max_tokens = req.get("max_tokens", 16)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
            self._error(400, f"max_tokens must be an integer from 1 to {MAX_TOKENS_LIMIT}, not {max_tokens!r}",
                        endpoint=endpoint)
            return
        prompt = req.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        prompt = str(prompt)
        queued, computing = app.complete(max_tokens)
        prompt_tokens = len(prompt.split())
        doc = {"id": f"cmpl-{zlib.crc32(f'{time.time()}{id(self)}'.encode()):08x}", "object": "text_completion",
               "created": int(time.time()), "model": model,
               "choices": [{"index": 0, "text": app.text(prompt, max_tokens), "logprobs": None,
                            "finish_reason": "length"}],
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                         "total_tokens": prompt_tokens + max_tokens}}
        self._json(200, doc)
        app.metrics.observe(endpoint, 200, time.monotonic() - start, max_tokens)
        self._log(200, f" max_tokens={max_tokens} queued_ms={1000 * queued:.0f} "
                       f"compute_ms={1000 * computing:.0f} share={app.share:.2f}")


def make_server(app: LlmServer, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"app": app})
    httpd = ThreadingHTTPServer((host, port), handler)
    httpd.daemon_threads = True
    app.httpd = httpd
    return httpd


def serve(args: argparse.Namespace) -> int:
    try:
        model = read_model(args.model)
    except ModelError as exc:
        say(f"llm-server: error: {exc}", sys.stderr)
        return 1
    app = LlmServer(model, args.model, args.max_concurrency, args.load_gib_per_second, args.ms_per_token)
    say(f"loading model {model['name']} ({model['size_gib']:.1f} GiB) from {args.model} "
        f"at {args.load_gib_per_second:g} GiB/s")
    try:
        httpd = make_server(app, args.host, args.port)
    except OSError as exc:
        say(f"llm-server: error: cannot listen on {args.host}:{args.port}: {exc.strerror}", sys.stderr)
        return 1
    app.update_share()
    app.write_activity()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=app.drain, daemon=True).start())
    threading.Thread(target=app.load, daemon=True, name="load").start()
    threading.Thread(target=app.background, daemon=True, name="share").start()
    say(f"listening on :{httpd.server_address[1]} (max concurrency {app.max_concurrency}, "
        f"{app.ms_per_token:g} ms per token on a whole GPU)")
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    if app.stopping.is_set():
        app.drained.wait(35)  # drain() runs in its own thread: let it finish the accepted requests
    return 0


# --------------------------------------------------------------------------
# Load generator


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, int(-(-p * len(ordered) // 100)))  # ceil
    return ordered[min(rank, len(ordered)) - 1]


def failure_kind(exc: BaseException) -> str:
    """What a failed request met, in a word: http_503, refused, reset, timeout, dns, error."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"http_{exc.code}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "timeout"
    if isinstance(reason, ConnectionRefusedError):
        return "refused"
    if isinstance(reason, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) or \
            type(reason).__name__ in ("RemoteDisconnected", "IncompleteRead", "BadStatusLine"):
        return "reset"
    if isinstance(reason, socket.gaierror):
        return "dns"
    if isinstance(reason, OSError) and "timed out" in str(reason):
        return "timeout"
    return "error"


class LoadStats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.failures: dict[str, int] = {}
        # Answers (any status) by the replica that gave them (the X-Served-By header).
        self.served_by: dict[str, dict[str, int]] = {}
        self.latencies: list[float] = []
        self.window: list[float] = []
        self.window_sent = self.window_ok = 0
        self.window_failures: dict[str, int] = {}
        self.outstanding = 0

    def done(self, ms: float | None, kind: str | None, server: str | None = None) -> None:
        with self.lock:
            self.outstanding -= 1
            if server:
                counts = self.served_by.setdefault(server, {"ok": 0, "failed": 0})
                counts["ok" if kind is None else "failed"] += 1
            if kind is None:
                self.ok += 1
                self.window_ok += 1
                self.latencies.append(ms or 0.0)
                self.window.append(ms or 0.0)
            else:
                self.failures[kind] = self.failures.get(kind, 0) + 1
                self.window_failures[kind] = self.window_failures.get(kind, 0) + 1

    def tick(self, second: int) -> str:
        with self.lock:
            sent, ok, fails, window = self.window_sent, self.window_ok, self.window_failures, self.window
            self.window_sent = self.window_ok = 0
            self.window_failures, self.window = {}, []
            total = f"total sent {self.sent} ok {self.ok} failed {sum(self.failures.values())}"
        failed = sum(fails.values())
        kinds = " (" + ", ".join(f"{k} {n}" for k, n in sorted(fails.items())) + ")" if fails else ""
        p50, p99 = percentile(window, 50), percentile(window, 99)
        lat = f"p50 {p50:.0f} ms p99 {p99:.0f} ms" if p50 is not None else "p50 - p99 -"
        return f"[{second:4d}s] sent {sent} ok {ok} failed {failed}{kinds} {lat} | {total}"


def summary_line(stats: LoadStats, url: str, seconds: float) -> str:
    """The last line loadgen prints: one JSON object (``json.loads(log.splitlines()[-1])``)."""
    with stats.lock:
        failed = sum(stats.failures.values())
        doc = {"summary": "loadgen", "url": url, "duration_s": round(seconds, 1), "sent": stats.sent,
               "ok": stats.ok, "failed": failed, "failures": dict(sorted(stats.failures.items())),
               "unanswered": stats.outstanding, "served_by": dict(sorted(stats.served_by.items())),
               "p50_ms": _round(percentile(stats.latencies, 50)), "p99_ms": _round(percentile(stats.latencies, 99)),
               "max_ms": _round(max(stats.latencies) if stats.latencies else None)}
    return json.dumps(doc)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def loadgen(args: argparse.Namespace, out=None, stop: threading.Event | None = None) -> int:
    """Send at ``args.rps`` until ``args.duration`` is over or ``stop`` is set (SIGTERM, SIGINT without one)."""
    out = out or sys.stdout
    if stop is None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    body = json.dumps({"model": args.model, "prompt": args.prompt, "max_tokens": args.max_tokens}
                      if args.model else {"prompt": args.prompt, "max_tokens": args.max_tokens}).encode()
    stats = LoadStats()
    limit = max(64, int(args.rps * (args.timeout + 1) * 2))

    def one() -> None:
        t0 = time.monotonic()
        req = urllib.request.Request(args.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=args.timeout) as resp:
                resp.read()
                server = resp.headers.get(SERVED_BY)
            stats.done(1000 * (time.monotonic() - t0), None, server)
        except Exception as exc:  # every failure is counted by kind, none stops the run
            headers = getattr(exc, "headers", None)  # an HTTP error answer names its replica too
            stats.done(None, failure_kind(exc), headers.get(SERVED_BY) if headers is not None else None)

    print(f"loadgen: {args.rps:g} requests/s to {args.url} for "
          f"{f'{args.duration:g} s' if args.duration > 0 else 'ever (until SIGTERM)'}, timeout {args.timeout:g} s",
          file=out, flush=True)
    start = time.monotonic()
    sent = 0
    next_tick = 1
    while not stop.is_set():
        now = time.monotonic() - start
        if args.duration > 0 and now >= args.duration:
            break
        due = int(now * args.rps) + 1 if args.rps > 0 else 0
        while sent < due and (args.duration <= 0 or sent < args.duration * args.rps):
            sent += 1
            with stats.lock:
                stats.sent += 1
                stats.window_sent += 1
                stats.outstanding += 1
                busy = stats.outstanding > limit
            if busy:
                stats.done(None, "client_busy")
            else:
                threading.Thread(target=one, daemon=True).start()
        if now >= next_tick:
            print(stats.tick(next_tick), file=out, flush=True)
            next_tick += 1
        wake = min((sent / args.rps) if args.rps > 0 else 1.0, next_tick)
        stop.wait(max(0.001, min(0.25, wake - (time.monotonic() - start))))
    # Answers still on their way get their timeout.
    deadline = time.monotonic() + args.timeout + 1
    while time.monotonic() < deadline:
        with stats.lock:
            if stats.outstanding <= 0:
                break
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    print(stats.tick(next_tick), file=out, flush=True)
    print(summary_line(stats, args.url, elapsed), file=out, flush=True)
    return 0


# --------------------------------------------------------------------------
# Command line

SUBCOMMANDS = ("serve", "fetch", "loadgen")


def _number(text: str, kind: type, minimum: float, strict: bool, rule: str) -> float:
    """``text`` as ``kind`` (int or float), at least ``minimum`` (above it when ``strict``); argparse's error else."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not (value > minimum or (not strict and value == minimum)):  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r} {rule}")
    return value


def _positive(text: str) -> float:
    return _number(text, float, 0, True, "must be greater than 0")


def _non_negative(text: str) -> float:
    return _number(text, float, 0, False, "must not be negative")


def _count(text: str) -> int:
    return int(_number(text, int, 1, False, "must be at least 1"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llm-server", description="gpulab's inference server (no real model: "
                                "real HTTP, readiness, queueing and GPU-share latency)")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="serve a model directory (the default)")
    s.add_argument("--model", required=True, metavar="DIR", help="model directory (with model.json)")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-concurrency", type=_count, default=8, help="requests computed at once (default 8)")
    s.add_argument("--load-gib-per-second", type=_positive, default=2.0,
                   help="weight read bandwidth; load time = size_gib / this (default 2)")
    s.add_argument("--ms-per-token", type=_non_negative, default=10.0,
                   help="decode time per token on a whole, otherwise idle GPU (default 10)")
    f = sub.add_parser("fetch", help="write a model directory, taking a download's time")
    f.add_argument("--name", required=True)
    f.add_argument("--size-gib", type=_positive, required=True)
    f.add_argument("--to", required=True, metavar="DIR")
    f.add_argument("--parameters", default=None, help="e.g. 7B (informational)")
    f.add_argument("--mib-per-second", type=_non_negative, default=500.0,
                   help="simulated download speed (default 500; 0: instant)")
    g = sub.add_parser("loadgen", help="send completions at a fixed rate and report latency and failures")
    g.add_argument("url", help="e.g. http://llm/v1/completions")
    g.add_argument("--rps", type=_positive, default=5.0, help="requests per second (default 5)")
    g.add_argument("--duration", type=_non_negative, default=30.0, help="seconds (default 30; 0: until killed)")
    g.add_argument("--timeout", type=_positive, default=10.0, help="seconds per request (default 10)")
    g.add_argument("--max-tokens", type=_count, default=16)
    g.add_argument("--prompt", default="Hello, GPU")
    g.add_argument("--model", default=None, help="the model field (default: none, the server's own)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS + ("-h", "--help"):
        argv = ["serve", *argv]  # as the image's entrypoint: pod args are serve's flags
    args = parser().parse_args(argv)
    threading.stack_size(THREAD_STACK)
    if args.command == "fetch":
        try:
            fetch(args.name, args.size_gib, args.to, args.parameters, args.mib_per_second)
        except OSError as exc:
            say(f"llm-server: error: cannot write the model directory {args.to}: {exc.strerror}", sys.stderr)
            return 1
        return 0
    if args.command == "loadgen":
        return loadgen(args)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
