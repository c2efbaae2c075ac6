"""README's list of GPU models is the model table's, in its order: a model added to models.yaml shows there."""

from __future__ import annotations

import re
from pathlib import Path

from gpulab.hardware import models

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_every_gpu_model_in_the_tables_order():
    text = README.read_text()
    match = re.search(r"GPU 型号（(.*?)）", text, re.S)
    assert match, "README no longer has its sentence listing the GPU models (GPU 型号（…）)"
    listed = re.findall(r"`([^`]+)`", match.group(1))
    assert listed == models.model_keys(), (
        f"README lists {listed}; gpulab/hardware/models.yaml has {models.model_keys()}: update README's list")
