"""Does record() write JSON values atomically where the results_path parameter points, and read them back?"""

from __future__ import annotations

import datetime as dt
import importlib
import json

import pytest

import gpulab._fsutil as fsutil

# The package exports the function record(), which shadows the submodule's name as an attribute.
rec = importlib.import_module("gpulab.grading.record")


@pytest.fixture(autouse=True)
def clean_state():
    rec.set_results_path(None)
    rec._memory.clear()
    yield
    rec.set_results_path(None)
    rec._memory.clear()


def test_record_writes_and_reads_back(tmp_path):
    path = tmp_path / "out" / "results.json"
    rec.set_results_path(path)
    assert rec.record("replicas", 4) == 4
    rec.record("allocatable", {"gpu-node-1": 2})
    rec.record("replicas", 5)  # re-recording replaces
    assert rec.load_results(path) == {"replicas": 5, "allocatable": {"gpu-node-1": 2}}
    assert json.loads(path.read_text(encoding="utf-8")) == {"allocatable": {"gpu-node-1": 2}, "replicas": 5}


def test_without_a_path_values_stay_in_memory(tmp_path):
    rec.record("x", [1, 2])
    assert rec.recorded() == {"x": [1, 2]}
    assert rec.results_path() is None


def test_results_path_comes_from_the_notebook_parameter(tmp_path, monkeypatch):
    class Shell:
        user_ns = {"results_path": str(tmp_path / "r.json")}

    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    rec.record("ok", True)
    assert rec.load_results(tmp_path / "r.json") == {"ok": True}


def test_conversion_of_common_types():
    class Model:  # shaped like a kubernetes client model
        def to_dict(self):
            return {"created": dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "labels": ("a", "b")}

    assert rec.to_jsonable(Model()) == {"created": "2025-01-02T03:04:05+00:00", "labels": ["a", "b"]}
    assert rec.to_jsonable({3, 1, 2}) == [1, 2, 3]


@pytest.mark.parametrize("bad", [object(), float("nan"), {1: "x"}])
def test_unserialisable_values_get_a_chinese_error(bad):
    with pytest.raises(TypeError, match="record\\(\\)"):
        rec.record("bad", bad)


def test_name_must_be_a_string():
    with pytest.raises(ValueError, match="非空字符串"):
        rec.record("", 1)


def test_a_crash_mid_write_keeps_earlier_values(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    rec.set_results_path(path)
    rec.record("first", 1)
    with monkeypatch.context() as patch:
        patch.setattr(fsutil.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("killed")))
        with pytest.raises(OSError):
            rec.record("second", 2)
    assert rec.load_results(path) == {"first": 1}


def test_load_results_errors(tmp_path):
    assert rec.load_results(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(rec.ResultsError, match="JSON object"):
        rec.load_results(tmp_path / "bad.json")
    (tmp_path / "worse.json").write_text("{")
    with pytest.raises(rec.ResultsError, match="not valid JSON"):
        rec.load_results(tmp_path / "worse.json")


def test_package_level_alias():
    import gpulab.grading as grading

    assert grading.record is rec.record and grading.load_results is rec.load_results
