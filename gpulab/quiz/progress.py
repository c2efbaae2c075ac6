"""Local quiz progress: ``$GPULAB_HOME/progress.json`` (default ``~/.gpulab``).

Layout::

    {"version": 1,
     "sections": {"04-sharing": {"sh-mig-count": {"answer": 7, "correct": true,
                                                  "attempts": 2, "updated": "2025-…Z",
                                                  "revealed": true}}}}

Only the latest answer of each question is kept (with an attempt counter).
``revealed`` (absent until then) records that the learner asked to see the
key ("显示答案"); it stays set when the question is answered again. A question
whose key was shown but that was never answered has ``revealed`` and no
``answer``: it is not counted as answered.
Every update is a locked read-modify-write followed by an atomic replace, so
two notebooks answering at once never lose each other's answers, and a kernel
killed mid-write leaves the previous file intact.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..i18n import _, cells, pad

from gpulab import paths
from gpulab._fsutil import atomic_write_json, locked

from .bank import Bank, load_all

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def gpulab_home() -> Path:
    """``$GPULAB_HOME`` or ``~/.gpulab`` (shared with the cluster's state, see :mod:`gpulab.paths`)."""
    return paths.home()


def progress_path() -> Path:
    return gpulab_home() / "progress.json"


@dataclass(frozen=True)
class Entry:
    """The latest saved answer to one question."""

    answer: Any
    correct: bool
    attempts: int
    updated: str
    revealed: bool = False


@dataclass(frozen=True)
class SectionProgress:
    section: str
    title: str
    answered: int
    correct: int
    total: int
    revealed: int = 0


def _empty() -> dict[str, Any]:
    return {"version": FORMAT_VERSION, "sections": {}}


class ProgressStore:
    """Progress file access; ``path`` defaults to :func:`progress_path` at call time."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self._path = Path(path) if path is not None else None

    @property
    def path(self) -> Path:
        # Resolved lazily so that GPULAB_HOME set after import (tests, notebooks) is honoured.
        return self._path if self._path is not None else progress_path()

    # -- reading -----------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        path = self.path
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _empty()
        except (OSError, ValueError) as exc:
            return self._quarantine(path, exc)
        if not isinstance(data, dict) or not isinstance(data.get("sections"), dict):
            return self._quarantine(path, ValueError("unexpected structure"))
        return data

    def _quarantine(self, path: Path, exc: Exception) -> dict[str, Any]:
        # A hand-edited or foreign file must not break every quiz: keep it aside and start afresh.
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
        backup = path.with_name(f"{path.name}.corrupt-{stamp}")
        try:
            os.replace(path, backup)
            log.warning("progress file %s is unreadable (%s); moved to %s", path, exc, backup)
        except OSError:
            log.warning("progress file %s is unreadable (%s)", path, exc)
        return _empty()

    def load(self) -> dict[str, Any]:
        """The whole file as a dict (a fresh copy)."""
        return self._read()

    def get(self, section: str, qid: str) -> Entry | None:
        raw = self._read()["sections"].get(section, {}).get(qid)
        return _entry(raw)

    def entries(self, section: str) -> dict[str, Entry]:
        raw = self._read()["sections"].get(section, {})
        return {qid: e for qid, e in ((q, _entry(v)) for q, v in raw.items()) if e is not None}

    def revealed(self, section: str, qid: str) -> bool:
        """Whether the learner has asked to see this question's answer."""
        raw = self._read()["sections"].get(section, {}).get(qid)
        return isinstance(raw, Mapping) and bool(raw.get("revealed"))

    # -- writing -----------------------------------------------------------

    def record(self, section: str, qid: str, answer: Any, correct: bool) -> Entry:
        """Save the latest answer to ``section``/``qid`` and bump its attempt count."""
        json.dumps(answer)  # fail before touching the file if the answer cannot be stored
        now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        with locked(self.path):
            data = self._read()
            previous = data["sections"].get(section, {}).get(qid) or {}
            entry = {
                "answer": answer,
                "correct": bool(correct),
                "attempts": int(previous.get("attempts", 0)) + 1,
                "updated": now,
            }
            entry.update({k: previous[k] for k in ("revealed", "revealed_at") if k in previous})
            data["version"] = FORMAT_VERSION
            data["sections"].setdefault(section, {})[qid] = entry
            atomic_write_json(self.path, data)
        return Entry(answer, bool(correct), entry["attempts"], now, bool(entry.get("revealed")))

    def mark_revealed(self, section: str, qid: str) -> None:
        """Record that the key of ``section``/``qid`` was shown ("显示答案"); the answer is kept."""
        now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        with locked(self.path):
            data = self._read()
            questions = data["sections"].setdefault(section, {})
            previous = questions.get(qid)
            entry = dict(previous) if isinstance(previous, Mapping) else {}
            entry["revealed"] = True
            entry.setdefault("revealed_at", now)
            questions[qid] = entry
            data["version"] = FORMAT_VERSION
            atomic_write_json(self.path, data)

    def reset(self, section: str | None = None) -> None:
        """Forget one section's answers, or all of them."""
        with locked(self.path):
            data = self._read()
            if section is None:
                data = _empty()
            else:
                data["sections"].pop(section, None)
            atomic_write_json(self.path, data)


def _entry(raw: Any) -> Entry | None:
    if not isinstance(raw, Mapping) or "answer" not in raw:
        return None
    return Entry(raw["answer"], bool(raw.get("correct")), int(raw.get("attempts", 1)), str(raw.get("updated", "")),
                 bool(raw.get("revealed")))


def summary(banks: Mapping[str, Bank] | None = None, store: ProgressStore | None = None
            ) -> dict[str, SectionProgress]:
    """Per-section answered/correct/total; answers to questions no longer in a bank are ignored."""
    banks = banks if banks is not None else load_all()
    store = store or ProgressStore()
    sections = store.load()["sections"]
    result = {}
    for name, bank in banks.items():
        saved = sections.get(name, {})
        ids = [q.id for q in bank.questions]
        entries = [e for e in (_entry(saved.get(qid)) for qid in ids) if e is not None]
        revealed = sum(isinstance(saved.get(qid), Mapping) and bool(saved[qid].get("revealed")) for qid in ids)
        result[name] = SectionProgress(name, bank.title, len(entries), sum(e.correct for e in entries), len(ids),
                                       revealed)
    return result


def _rows(progress: Mapping[str, SectionProgress]) -> Iterator[list[str]]:
    yield [_("SECTION"), _("TITLE"), _("ANSWERED"), _("CORRECT"), _("QUESTIONS")]
    answered = correct = total = 0
    for p in progress.values():
        answered, correct, total = answered + p.answered, correct + p.correct, total + p.total
        yield [p.section, p.title, str(p.answered), str(p.correct), str(p.total)]
    yield [_("TOTAL"), "", str(answered), str(correct), str(total)]


def format_summary(progress: Mapping[str, SectionProgress] | None = None) -> str:
    """A plain-text table of :func:`summary`, aligned for CJK text, its headers in the user's language (for
    ``gpulab progress``)."""
    progress = progress if progress is not None else summary()
    rows = list(_rows(progress))
    widths = [max(cells(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        shown = [pad(cell, widths[i], right=i >= 2) for i, cell in enumerate(row)]
        lines.append("  ".join(shown).rstrip())
        if n == 0 or n == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
