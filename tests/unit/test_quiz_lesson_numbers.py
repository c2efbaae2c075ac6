"""Numeric quiz keys that follow from the lessons' own numbers, recomputed from where the lessons take them.

A key written by hand drifts when a lesson's model, manifest or hardware data changes (``inf-replicas-memory``
once said 80 ÷ 16 = 5 while the lesson's card reports 81559 MiB, so 4). Each test here takes the numbers from
the files the lesson itself reads — the topology's GPU model in ``gpulab/hardware/models.yaml``, the lesson's
manifests — computes the key and compares it with the bank, and checks that the prompt states the numbers the
learner needs.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from gpulab.fakegpu.ledger import MEMORY_ANNOTATION
from gpulab.hardware.models import get_model
from gpulab.kube import topology
from gpulab.quiz.bank import grade_answer, load_all

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def banks():
    return load_all(REPO / "quizzes")


def lesson_gpu_model():
    """The GPU model of the cluster every lesson runs on (``gpulab up``'s default topology)."""
    models = {n.gpu_model for n in topology.load(topology.default_path()).gpu_nodes}
    assert len(models) == 1, models
    return get_model(models.pop())


def lesson_gpu_count() -> int:
    counts = {n.gpu_count for n in topology.load(topology.default_path()).gpu_nodes}
    assert len(counts) == 1, counts
    return counts.pop()


def mib(quantity: str) -> int:
    """A Kubernetes binary quantity (``16Gi``, ``16384Mi``) in MiB."""
    match = re.fullmatch(r"(\d+)(Mi|Gi|Ti)", quantity)
    assert match, quantity
    return int(match.group(1)) * {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}[match.group(2)]


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def replica_memory_mib() -> int:
    """GPU memory of one model-server replica: the 7B server's manifest declares what its CUDA program holds.

    The lesson's own ``manifests/06-inference/llm.yaml`` declares no GPU memory (its server only loads and
    answers probes); the exercise-3 server the lesson sizes is ``manifests/labs/06-inference-sizing/llm.yaml``.
    """
    found = {mib(str(d["spec"]["template"]["metadata"]["annotations"][MEMORY_ANNOTATION]))
             for d in docs(REPO / "manifests" / "labs" / "06-inference-sizing" / "llm.yaml")
             if d.get("kind") == "Deployment"}
    assert len(found) == 1, found
    return found.pop()


def lesson_outputs(name: str) -> str:
    nb = json.loads((REPO / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))
    return "\n".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                     for o in c.get("outputs", []))


def test_replicas_per_card_key_follows_the_lessons_card_and_replica(banks):
    question = banks["06-inference"].question("inf-replicas-memory")
    card, replica = lesson_gpu_model().memory_mib, replica_memory_mib()
    fits = math.floor(card / replica)
    assert question.answer == fits and question.tolerance == 0
    assert grade_answer(question, fits).correct and not grade_answer(question, fits + 1).correct
    # The prompt gives the learner the very numbers the key is computed from …
    assert str(card) in question.prompt and str(replica) in question.prompt
    # … and they are the ones the lesson shows (its stored output of the sizing cell).
    assert f"每张卡 {card} MiB，每个副本 {replica} MiB" in lesson_outputs("06-inference")


def test_mig_instances_key_follows_the_models_layout(banks):
    question = banks["04-sharing"].question("sh-mig-count")
    assert "all-1g.10gb" in question.prompt and "H100" in question.prompt
    model = lesson_gpu_model()
    assert "H100" in model.product_name
    assert question.answer == model.layout("all-1g.10gb").profile_counts["1g.10gb"]


def test_time_slicing_capacity_key_follows_the_lessons_config(banks):
    question = banks["04-sharing"].question("sh-ts-capacity")
    configs = [d for d in docs(REPO / "manifests" / "04-sharing" / "time-slicing-config.yaml")
               if d.get("kind") == "ConfigMap"]
    assert len(configs) == 1
    replicas = {r["replicas"] for text in configs[0]["data"].values()
                for r in yaml.safe_load(text)["sharing"]["timeSlicing"]["resources"]}
    assert len(replicas) == 1
    per_card, cards = replicas.pop(), lesson_gpu_count()
    assert f"replicas: {per_card}" in question.prompt and f"{cards} 张物理 GPU" in question.prompt
    assert question.answer == cards * per_card
