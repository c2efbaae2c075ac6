"""Per-lab check modules.

``lab_NN.py`` holds the checks of ``labs/NN-<slug>.ipynb`` (resolved by
:func:`gpulab.grading.checks.lab_module_name`): module-level functions
decorated with :func:`gpulab.grading.checks.check`, collected in definition
order, plus an optional ``LAB = "NN-<slug>"``. A worked example (the
chapter's ``gpu-train-demo`` Job), used by the grading tests, lives in
tests/unit/example_lab.py.
"""
