"""README's list of GPU models is the model table's, in its order: a model added to models.yaml shows there."""

from __future__ import annotations

import re
from pathlib import Path

from gpulab.hardware import models

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# The sentences that list the models: "GPU 型号（`h100-80gb`、…）" in the Chinese part and, should the
# English part list them too, "GPU models (`h100-80gb`, …)".
LISTS = re.compile(r"GPU 型号（(.*?)）|GPU models? \((`.*?)\)", re.S)
# A model key with its memory, as models.yaml spells them (h100-80gb), anywhere in a text.
SIZED_KEY = re.compile(r"(?<![\w.-])[a-z]\d{1,3}-\d+gb(?![\w.-])")


def _model_lists(text: str) -> list[list[str]]:
    return [re.findall(r"`([^`]+)`", m.group(1) or m.group(2)) for m in LISTS.finditer(text)]


def _drift(text: str) -> list[str]:
    """What is wrong with a README's model lists, against the registry (gpulab/hardware/models.yaml)."""
    keys = models.model_keys()
    lists = _model_lists(text)
    if not lists:
        return ["README no longer has its sentence listing the GPU models (GPU 型号（…）)"]
    return [f"README lists {listed}; gpulab/hardware/models.yaml has {keys}: update README's list"
            for listed in lists if listed != keys]


def test_readme_lists_every_gpu_model_in_the_tables_order():
    assert not _drift(README.read_text())


def test_a_model_missing_from_the_list_is_caught():
    text = README.read_text()
    assert "`a30`、" in text
    assert _drift(text.replace("`a30`、", "", 1)), "a README without the A30 in its list passed"
    assert _drift(text.replace("GPU 型号（", "GPU（", 1)), "a README without its model sentence passed"


def test_every_model_key_the_docs_name_is_registered():
    keys = set(models.model_keys())
    for name in ("README.md", "DEVELOPMENT.md"):
        unknown = sorted(set(SIZED_KEY.findall((REPO / name).read_text())) - keys)
        assert not unknown, f"{name} names GPU models that gpulab/hardware/models.yaml does not have: {unknown}"
