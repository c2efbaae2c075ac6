"""Atomic writes keep or set the file mode; file_identity notices a rewrite."""

from __future__ import annotations

import os

from gpulab._fsutil import atomic_write_text, file_identity


def test_atomic_write_sets_the_mode_asked_for(tmp_path):
    target = tmp_path / "bin" / "nvidia-smi"
    atomic_write_text(target, "#!/bin/sh\n", mode=0o755)
    assert target.read_text() == "#!/bin/sh\n"
    assert target.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in target.parent.iterdir()] == ["nvidia-smi"]  # no temporary file left


def test_atomic_write_keeps_an_existing_mode(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_text("a")
    os.chmod(target, 0o600)
    atomic_write_text(target, "b")
    assert target.stat().st_mode & 0o777 == 0o600


def test_file_identity_changes_with_content_and_is_none_when_missing(tmp_path):
    target = tmp_path / "hw.json"
    assert file_identity(target) is None
    assert file_identity(None) is None
    atomic_write_text(target, "{}")
    first = file_identity(target)
    atomic_write_text(target, '{"mig": "all-1g.10gb"}')
    assert first is not None and file_identity(target) != first
