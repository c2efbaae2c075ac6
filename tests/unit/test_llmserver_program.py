"""The inference server program (gpulab/fakegpu/llmserver.py), without a cluster: its share of a GPU
from the nvidia-smi state, the latency model, readiness while loading, its metrics page, its model
directory and its load generator, on 127.0.0.1."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulab.fakegpu import llmserver, smistate

SCRIPT = Path(llmserver.__file__)


def state(mig_layout: str | None = None, utilization: int = 0) -> dict:
    s = smistate.build_state("h100-80gb", 2, "gpu-node-1", mig_layout=mig_layout)
    for gpu in s["gpus"]:
        gpu["utilization_gpu"] = utilization
    return s


def test_a_mig_device_computes_with_its_sms_whatever_its_neighbours_do() -> None:
    s = state("all-1g.10gb", utilization=100)
    mig = s["gpus"][0]["mig_devices"][0]
    share, why = llmserver.compute_share(s, mig["uuid"])
    assert share == pytest.approx(mig["sm"] / 132)  # an H100 has 132 SMs; a 1g slice 16
    assert "MIG 1g.10gb" in why


def test_a_whole_gpu_is_shared_in_time_with_its_busy_neighbours() -> None:
    uuid = state()["gpus"][0]["uuid"]
    assert llmserver.compute_share(state(utilization=0), uuid)[0] == 1.0
    assert llmserver.compute_share(state(utilization=100), uuid)[0] == 0.5       # a busy neighbour: half
    assert llmserver.compute_share(state(utilization=100), uuid, 100)[0] == 1.0  # all of it is our own
    assert llmserver.compute_share(state(utilization=60), f"{uuid}::2", 10)[0] == pytest.approx(1 / 1.5)


def test_a_neighbour_that_wants_the_whole_gpu_halves_the_share_though_the_card_shows_100() -> None:
    # A training job wants 100 % and this server computes 32 %: the card prints 100 (capped); what the
    # neighbours want, in the container's own file, is what slows us, not the capped sum less our own.
    s = state(utilization=100)
    s["gpus"][0]["utilization_neighbours"] = 100
    assert llmserver.compute_share(s, s["gpus"][0]["uuid"], 32)[0] == 0.5
    s["gpus"][0]["utilization_neighbours"] = 0   # we are alone and busy: the card's 100 % is our own
    assert llmserver.compute_share(s, s["gpus"][0]["uuid"], 0)[0] == 1.0


def test_without_a_gpu_the_share_is_one_and_it_says_why() -> None:
    assert llmserver.compute_share(None, None) == (1.0, "no GPU state file: compute share 1 (no GPU to share)")
    assert llmserver.compute_share(state(utilization=100), "none")[0] == 1.0


def test_latency_is_tokens_times_ms_per_token_over_the_share() -> None:
    assert llmserver.latency_seconds(16, 10, 1.0) == pytest.approx(0.16)
    assert llmserver.latency_seconds(16, 10, 0.5) == pytest.approx(0.32)
    assert llmserver.latency_seconds(16, 10, 16 / 132) == pytest.approx(0.16 * 132 / 16)


@pytest.fixture
def model_dir(tmp_path) -> Path:
    out = io.StringIO()
    assert llmserver.fetch("tiny-1b", 0.25, str(tmp_path / "m"), "1B", mib_per_second=0, out=out) is True
    assert "fetched tiny-1b" in out.getvalue()
    return tmp_path / "m"


def test_fetch_writes_a_model_directory_once(model_dir) -> None:
    model = llmserver.read_model(str(model_dir))
    assert (model["name"], model["size_gib"], model["parameters"]) == ("tiny-1b", 0.25, "1B")
    out = io.StringIO()
    assert llmserver.fetch("tiny-1b", 0.25, str(model_dir), out=out) is False
    assert "already" in out.getvalue()


@pytest.mark.parametrize("content, expected", [
    (None, "does not exist"),
    ("", "has no model.json"),
    ("{not json", "is not valid JSON"),
    ('{"name": "x"}', "'size_gib' must be a positive number"),
    ('{"name": "x", "size_gib": 1, "format": "safetensors"}', "format 'safetensors'"),
])
def test_a_bad_model_directory_is_an_error_that_names_what_and_where(tmp_path, content, expected) -> None:
    d = tmp_path / "model"
    if content is not None:
        d.mkdir()
        if content:
            (d / "model.json").write_text(content)
    # Run as in a pod: the host's python3, the file alone (-I: not next to gpulab's other modules).
    proc = subprocess.run(["/usr/bin/python3", "-I", str(SCRIPT), "--model", str(d)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert expected in proc.stderr and str(d) in proc.stderr
    assert proc.stdout == ""


class Running:
    """A server on 127.0.0.1, in this process."""

    def __init__(self, model_dir: Path, env: dict | None = None, **kw):
        self.app = llmserver.LlmServer(llmserver.read_model(str(model_dir)), str(model_dir), env=env or {}, **kw)
        self.httpd = llmserver.make_server(self.app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def close(self) -> None:
        self.app.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(model_dir):
    servers: list[Running] = []

    def start(**kw) -> Running:
        servers.append(Running(model_dir, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_health_fails_while_the_weights_load_and_passes_after(server, capsys) -> None:
    s = server(load_gib_per_second=1.0, ms_per_token=0)  # 0.25 GiB: a quarter of a second
    assert s.get("/health")[0] == 503
    assert s.post({"prompt": "hi"})[0] == 503
    s.app.load()
    assert s.get("/health") == (200, b"")
    assert "model loaded in" in capsys.readouterr().out


def test_a_completion_answers_in_openais_shape_and_counts_in_metrics(server, capsys) -> None:
    s = server(ms_per_token=1)
    s.app.loaded.set()
    code, doc = s.post({"model": "tiny-1b", "prompt": "Hello there GPU", "max_tokens": 5})
    assert code == 200
    assert doc["object"] == "text_completion" and doc["model"] == "tiny-1b"
    assert len(doc["choices"][0]["text"].split()) == 5
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert s.post({"model": "other", "prompt": "x"})[0] == 404
    assert s.post({"prompt": "x", "max_tokens": 0})[0] == 400
    assert json.loads(s.get("/v1/models")[1])["data"][0]["id"] == "tiny-1b"
    log = capsys.readouterr().out
    assert '"POST /v1/completions" 200 max_tokens=5' in log

    code, page = s.get("/metrics")
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(page.decode())}
    requests = {(x.labels["endpoint"], x.labels["code"]): x.value for x in families["llm_requests"].samples}
    assert requests[("/v1/completions", "200")] == 1
    assert requests[("/v1/completions", "404")] == 1 and requests[("/v1/completions", "400")] == 1
    buckets = [x for x in families["llm_request_duration_seconds"].samples if x.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 1
    gauges = {f.name: f.samples[0].value for f in families.values() if f.type == "gauge"}
    assert gauges["llm_model_loaded"] == 1 and gauges["llm_requests_in_flight"] == 0
    assert gauges["llm_requests_queued"] == 0 and gauges["llm_compute_share"] == 1


def test_a_busy_neighbour_on_the_gpu_doubles_the_latency(server, tmp_path) -> None:
    s_file = tmp_path / "nvidia-smi.json"
    busy = state(utilization=100)
    s_file.write_text(json.dumps(busy))
    s = server(ms_per_token=10, env={llmserver.STATE_ENV: str(s_file),
                                     llmserver.VISIBLE_ENV: busy["gpus"][0]["uuid"]})
    s.app.loaded.set()
    s.app.update_share()
    assert s.app.share == 0.5
    queued, computing = s.app.complete(10)
    assert computing >= 0.19  # 10 tokens x 10 ms / 0.5; never less (sleeps only overshoot)


def test_on_a_gpu_shared_in_time_its_own_report_is_not_a_neighbour_and_counts_its_slice(server, tmp_path) -> None:
    s_file, activity = tmp_path / "nvidia-smi.json", tmp_path / "busy"
    busy = state(utilization=100)
    s = server(ms_per_token=10, env={llmserver.STATE_ENV: str(s_file), llmserver.ACTIVITY_ENV: str(activity),
                                     llmserver.VISIBLE_ENV: busy["gpus"][0]["uuid"]})
    s.app.loaded.set()
    s.app.busy_percent = 100
    s.app.write_activity()
    s_file.write_text(json.dumps(busy))  # the node wrote the card's 100 % after reading our 100 %
    s.app.update_share()
    assert (s.app.share, s.app.time_sliced) == (1.0, True)
    past = time.time() - 60
    os.utime(s_file, (past, past))       # written before we reported anything: all of it is a neighbour's
    s.app.update_share()
    assert s.app.share == 0.5
    start = time.monotonic()
    s.app.complete(10)                   # busy the whole window, with half the GPU's time
    assert 40 <= s.app.sample_busy(time.monotonic() - start) <= 50


def test_requests_beyond_the_concurrency_wait_in_the_queue(server) -> None:
    s = server(ms_per_token=20, max_concurrency=1)
    s.app.loaded.set()
    threads = [threading.Thread(target=s.post, args=({"prompt": "x", "max_tokens": 10},)) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while s.app.queued < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.app.queued == 2 and s.app.in_flight == 1
    for t in threads:
        t.join()
    assert s.app.queued == 0 and s.app.in_flight == 0


def test_the_busy_percent_is_reported_through_the_activity_file(server, tmp_path) -> None:
    activity = tmp_path / "activity" / "busy"
    activity.parent.mkdir()
    s = server(ms_per_token=10, env={llmserver.ACTIVITY_ENV: str(activity)})
    s.app.loaded.set()
    s.app.sample_busy(1.0)
    start = time.monotonic()
    s.app.complete(20)  # 0.2 s computing
    assert 10 <= s.app.sample_busy(time.monotonic() - start) <= 100
    s.app.write_activity()
    assert int(activity.read_text()) == s.app.busy_percent
    assert not list(activity.parent.glob(".*"))  # replaced whole, no temporary file left


def test_loadgen_counts_answers_and_failures_by_kind(server) -> None:
    s = server(ms_per_token=1)
    s.app.loaded.set()
    args = argparse.Namespace(url=s.url + "/v1/completions", rps=20.0, duration=1.0, timeout=5.0,
                              max_tokens=4, prompt="hi", model=None)
    out = io.StringIO()
    assert llmserver.loadgen(args, out=out, stop=threading.Event()) == 0
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["sent"] == 20 and summary["ok"] == 20 and summary["failed"] == 0
    assert summary["p50_ms"] >= 4 and summary["p99_ms"] >= summary["p50_ms"]
    assert "[   1s] sent" in out.getvalue()
    # Every answer names the replica that gave it, as the X-Served-By header says.
    assert summary["served_by"] == {llmserver.HOSTNAME: {"ok": 20, "failed": 0}}

    s.close()  # nothing listens there now
    out = io.StringIO()
    llmserver.loadgen(argparse.Namespace(**{**vars(args), "duration": 0.5}), out=out, stop=threading.Event())
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["ok"] == 0 and summary["failures"] == {"refused": summary["sent"]}


def test_the_program_runs_alone_with_the_hosts_python(tmp_path) -> None:
    """As in a pod: python3 and this one file; fetch, then serve (the default subcommand) until SIGTERM."""
    py = ["/usr/bin/python3", "-I", str(SCRIPT)]
    fetched = subprocess.run(py + ["fetch", "--name", "tiny", "--size-gib", "0.1", "--to", str(tmp_path / "m"),
                                   "--mib-per-second", "0"], capture_output=True, text=True, timeout=30)
    assert fetched.returncode == 0, fetched.stderr
    proc = subprocess.Popen(py + ["--model", str(tmp_path / "m"), "--host", "127.0.0.1", "--port", "0",
                                  "--load-gib-per-second", "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
    finally:
        proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert lines[0].startswith("loading model tiny (0.1 GiB) from ")
    assert "listening on :" in "".join(lines) and "model loaded in" in "".join(lines)
    assert "SIGTERM" in out and out.rstrip().endswith("bye")
