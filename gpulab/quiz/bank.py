"""Question banks: YAML files under ``quizzes/``, one per chapter section.

File format (``quizzes/NN-<slug>.yaml``)::

    section: 04-sharing          # must equal the file stem
    title: GPU 共享               # shown above the quiz
    description: ...             # optional
    questions:
      - id: sh-mig-count         # [a-z0-9-], unique across all banks
        type: numeric            # single | multiple | numeric | short
        prompt: ...              # Markdown-ish: `code`, **bold**, ``` fences
        answer: 7
        tolerance: 0             # numeric only, absolute, default 0
        unit: 个                  # numeric only, optional
        explanation: ...         # why the key is right and the distractors wrong
        hint: ...                # optional: shown after a wrong answer; must not give the key away

Choice questions carry ``options`` (a mapping ``id: text``, in display order)
and ``answer`` (one id for ``single``, a list of ids for ``multiple``). Short
answers carry ``accept`` (literal answers) and/or ``patterns`` (regular
expressions, matched in full); both are compared after :func:`normalize`.

A wrong answer is answered with a hint, not with the key: the question's
``hint`` if it has one, else a generic one for its type (:data:`GENERIC_HINTS`);
the explanation is for a correct answer or an explicit "show the answer".

Every problem found in a file is reported at once, each naming the file, the
question id, the field and what is allowed.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from gpulab import paths

QUESTION_TYPES = ("single", "multiple", "numeric", "short")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_OPTION_ID_RE = re.compile(r"^[a-z0-9]+$")
_SECTION_RE = re.compile(r"^(\d{2})-[a-z0-9][a-z0-9-]*$")

_COMMON_FIELDS = ("id", "type", "prompt", "explanation", "hint")
_TYPE_FIELDS = {
    "single": ("options", "answer"),
    "multiple": ("options", "answer"),
    "numeric": ("answer", "tolerance", "unit"),
    "short": ("accept", "patterns"),
}
_BANK_FIELDS = ("section", "title", "description", "questions")

# Shown after a wrong answer when the question has no ``hint`` of its own.
GENERIC_HINTS = {
    "single": "再想想：对照题干里的条件，看看你选的这一项哪里说不通，再换一个选项试试。",
    "multiple": "再想想：把每个选项单独拿出来判断，只勾选本身就成立的那些。",
    "numeric": "再想想：把计算过程重新列一遍，注意题目问的是哪个量、用什么单位。",
    "short": "再想想：答案是一个确切的写法（名字、字段或命令），回到章节里对应的地方核对拼写，写完整。",
}


class BankError(ValueError):
    """Raised when a question bank cannot be loaded; ``problems`` lists every issue."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid question bank:\n" + "\n".join(f"  - {p}" for p in self.problems))


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Option:
    id: str
    text: str


@dataclass(frozen=True)
class Question:
    """Fields shared by every question type; see the subclasses for the key."""

    kind: ClassVar[str] = ""
    id: str
    section: str
    prompt: str
    explanation: str
    hint: str = field(default="", kw_only=True)


@dataclass(frozen=True)
class SingleChoice(Question):
    kind: ClassVar[str] = "single"
    options: tuple[Option, ...]
    answer: str

    def option(self, option_id: str) -> Option | None:
        return next((o for o in self.options if o.id == option_id), None)


@dataclass(frozen=True)
class MultipleChoice(Question):
    kind: ClassVar[str] = "multiple"
    options: tuple[Option, ...]
    answer: frozenset[str]

    def option(self, option_id: str) -> Option | None:
        return next((o for o in self.options if o.id == option_id), None)


@dataclass(frozen=True)
class Numeric(Question):
    kind: ClassVar[str] = "numeric"
    answer: float
    tolerance: float = 0.0
    unit: str = ""


@dataclass(frozen=True)
class ShortAnswer(Question):
    kind: ClassVar[str] = "short"
    accept: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class Bank:
    section: str
    title: str
    questions: tuple[Question, ...]
    path: Path | None = None
    description: str = ""

    @property
    def number(self) -> int:
        return int(self.section[:2])

    def question(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(f"section {self.section!r} has no question {qid!r}")


@dataclass(frozen=True)
class Feedback:
    """Outcome of grading one answer.

    ``answered`` is False when the input could not be taken as an answer at all
    (nothing chosen, not a number …); such attempts are not recorded and the
    explanation is withheld so that an empty click does not reveal the key.

    ``message`` says what is wrong without giving the key away (which option
    is not it, missing or extra choices, too big or too small); ``hint`` is set
    for wrong answers only. ``explanation`` is always the question's: front
    ends show it once the answer is correct or the learner asks for the key.
    """

    correct: bool
    message: str
    explanation: str
    answered: bool = True
    hint: str = ""


# --------------------------------------------------------------------------- grading

_QUOTES = "\"'`“”‘’「」『』《》"
_TRAILING_PUNCT = "。.！!？?；;，,、"
_LOOSE_RE = re.compile(r"[\s_\-]+")


def normalize(text: str) -> str:
    """Canonical form for comparing short answers.

    NFKC folds full-width letters, digits, punctuation and the ideographic space
    to their ASCII forms (``ｎｖｉｄｉａ．ｃｏｍ／ｇｐｕ`` → ``nvidia.com/gpu``);
    then case is folded, runs of whitespace collapse to one space, and quotes,
    backticks and a trailing full stop around the answer are dropped.
    """
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    text = " ".join(text.split())
    previous = None
    while previous != text:
        previous = text
        text = text.strip().rstrip(_TRAILING_PUNCT).strip()
        if len(text) >= 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
            text = text[1:-1]
    return text


def _loose(text: str) -> str:
    # "nvidia-device-plugin", "NVIDIA device plugin" and "nvidia_device_plugin" are one answer.
    return _LOOSE_RE.sub("", text)


_NUMBER_RE = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*([^\d]*)$")


def _parse_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        match = _NUMBER_RE.match(unicodedata.normalize("NFKC", str(value)))
        if not match:
            return None
        number = float(match.group(1))
    return number if math.isfinite(number) else None


def _choice_ids(question: SingleChoice | MultipleChoice, answer: Any) -> list[str] | None:
    """Option ids from a widget value, an id, ``"a,c"``, ``"ac"`` or a list; None if empty."""
    if answer is None:
        return None
    if isinstance(answer, str):
        text = unicodedata.normalize("NFKC", answer).casefold().strip()
        if not text:
            return None
        parts = [p for p in re.split(r"[\s,;/、]+", text) if p]
        valid = {o.id for o in question.options}
        if len(parts) == 1 and parts[0] not in valid and all(ch in valid for ch in parts[0]):
            parts = list(parts[0])
        return parts
    ids = [unicodedata.normalize("NFKC", str(a)).casefold().strip() for a in answer]
    return [i for i in ids if i] or None


def canonical_answer(question: Question, answer: Any) -> Any:
    """The JSON form an answer is saved in: an option id, a sorted id list, a float, or the text."""
    if isinstance(question, SingleChoice):
        ids = _choice_ids(question, answer)
        return ids[0] if ids and len(ids) == 1 else None
    if isinstance(question, MultipleChoice):
        return sorted(set(_choice_ids(question, answer) or []))
    if isinstance(question, Numeric):
        return _parse_number(answer)
    return "" if answer is None else str(answer)


def grade_answer(question: Question, answer: Any) -> Feedback:
    """Grade ``answer`` against ``question``'s key and explain the result in zh-CN."""
    if isinstance(question, (SingleChoice, MultipleChoice)):
        return _grade_choice(question, answer)
    if isinstance(question, Numeric):
        return _grade_numeric(question, answer)
    if isinstance(question, ShortAnswer):
        return _grade_short(question, answer)
    raise TypeError(f"not a question: {question!r}")


def _unanswered(message: str) -> Feedback:
    return Feedback(correct=False, message=message, explanation="", answered=False)


def hint_for(question: Question) -> str:
    """The hint shown after a wrong answer: the bank's own, else a generic one for the type."""
    return question.hint or GENERIC_HINTS[question.kind]


def _wrong(question: Question, message: str) -> Feedback:
    return Feedback(False, message, question.explanation, hint=hint_for(question))


def format_number(value: float) -> str:
    """``7.0`` → ``7``, ``0.5`` → ``0.5``: how numeric answers are written back to learners."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def key_lines(question: Question) -> list[str]:
    """The key in words (Markdown-ish, like the bank text), for "显示答案"."""
    if isinstance(question, SingleChoice):
        option = question.option(question.answer)
        return [f"{question.answer.upper()}. {option.text if option else ''}".rstrip()]
    if isinstance(question, MultipleChoice):
        return [f"{o.id.upper()}. {o.text}" for o in question.options if o.id in question.answer]
    if isinstance(question, Numeric):
        text = format_number(question.answer) + (f" {question.unit}" if question.unit else "")
        if question.tolerance:
            text += f"（允许误差 ±{format_number(question.tolerance)}）"
        return [text]
    if isinstance(question, ShortAnswer):
        if question.accept:
            lines = [f"`{question.accept[0]}`"]
            if len(question.accept) > 1:
                lines.append("也接受：" + "、".join(f"`{a}`" for a in question.accept[1:]))
            return lines
        return ["（按规则判分，写法见解析）"]
    raise TypeError(f"not a question: {question!r}")


def _grade_choice(question: SingleChoice | MultipleChoice, answer: Any) -> Feedback:
    ids = _choice_ids(question, answer)
    if not ids:
        return _unanswered("还没有选择任何选项。")
    valid = [o.id for o in question.options]
    unknown = [i for i in ids if i not in valid]
    if unknown:
        return _unanswered(f"没有这个选项：{'、'.join(unknown)}（可选：{'、'.join(valid)}）。")
    if isinstance(question, SingleChoice):
        if len(ids) != 1:
            return _unanswered("这是单选题，只能选一个选项。")
        if ids[0] == question.answer:
            return Feedback(True, "回答正确。", question.explanation)
        return _wrong(question, f"回答错误：{ids[0].upper()} 不是正确答案。")
    chosen = set(ids)
    key = set(question.answer)
    if chosen == key:
        return Feedback(True, "回答正确：所有正确选项都选到了，也没有多选。", question.explanation)
    if chosen < key:
        message = "还不完全对：选中的都对，但漏选了正确的选项。"
    elif chosen > key:
        message = "还不完全对：正确的都选到了，但多选了不该选的选项。"
    else:
        message = "回答错误：既有选错的，也有漏选的。"
    return _wrong(question, message)


def _grade_numeric(question: Numeric, answer: Any) -> Feedback:
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        return _unanswered("还没有填写数值。")
    number = _parse_number(answer)
    if number is None:
        return _unanswered(f"“{answer}”不是一个数字，请只填写数值。")
    if abs(number - question.answer) <= question.tolerance + 1e-9:
        return Feedback(True, "回答正确。", question.explanation)
    return _wrong(question, "数值不对：偏大了。" if number > question.answer else "数值不对：偏小了。")


def _grade_short(question: ShortAnswer, answer: Any) -> Feedback:
    text = normalize("" if answer is None else str(answer))
    if not text:
        return _unanswered("还没有填写答案。")
    accepted = {normalize(a) for a in question.accept}
    if text in accepted or _loose(text) in {_loose(a) for a in accepted}:
        return Feedback(True, "回答正确。", question.explanation)
    if any(p.fullmatch(text) for p in question.patterns):
        return Feedback(True, "回答正确。", question.explanation)
    return _wrong(question, "回答错误。")


# --------------------------------------------------------------------------- loading


def quiz_dir() -> Path:
    """Directory holding the banks: ``$GPULAB_QUIZ_DIR`` or ``quizzes/`` at the repository root."""
    override = os.environ.get("GPULAB_QUIZ_DIR")
    if override:
        return Path(override)
    return paths.repo_root() / "quizzes"


class _Problems:
    """Collects problems for one file so that all of them are reported together."""

    def __init__(self, path: Path | str):
        self.where = str(path)
        self.items: list[str] = []

    def add(self, message: str, qid: str | None = None, field: str | None = None) -> None:
        parts = [self.where]
        if qid is not None:
            parts.append(f"question {qid!r}")
        if field is not None:
            parts.append(f"field {field!r}")
        self.items.append(": ".join(parts) + ": " + message)


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _parse_options(raw: Any, qid: str, problems: _Problems) -> tuple[Option, ...]:
    if not isinstance(raw, Mapping) or len(raw) < 2:
        problems.add("must be a mapping of at least 2 options, e.g. {a: '...', b: '...'}", qid, "options")
        return ()
    options = []
    for key, text in raw.items():
        if not isinstance(key, str) or not _OPTION_ID_RE.match(key):
            problems.add(f"option id {key!r} must be lowercase letters/digits (e.g. a, b, c)", qid, "options")
            continue
        if _text(text) is None:
            problems.add(f"option {key!r} needs non-empty text", qid, "options")
            continue
        options.append(Option(key, text.strip()))
    return tuple(options)


def _parse_question(raw: Any, section: str, index: int, problems: _Problems) -> Question | None:
    if not isinstance(raw, Mapping):
        problems.add(f"questions[{index}] must be a mapping, got {type(raw).__name__}")
        return None
    qid = raw.get("id")
    if not isinstance(qid, str) or not _ID_RE.match(qid):
        problems.add(f"questions[{index}] needs an id of lowercase letters, digits and '-', got {qid!r}",
                     field="id")
        return None
    before = len(problems.items)
    qtype = raw.get("type")
    if qtype not in QUESTION_TYPES:
        problems.add(f"must be one of {', '.join(QUESTION_TYPES)}, got {qtype!r}", qid, "type")
        return None
    allowed = _COMMON_FIELDS + _TYPE_FIELDS[qtype]
    for name in raw:
        if name not in allowed:
            problems.add(f"unknown field for a {qtype} question (allowed: {', '.join(allowed)})", qid, str(name))
    prompt, explanation = _text(raw.get("prompt")), _text(raw.get("explanation"))
    if prompt is None:
        problems.add("must be a non-empty string", qid, "prompt")
    if explanation is None:
        problems.add("must be a non-empty string that explains why the key is right", qid, "explanation")
    hint = _text(raw.get("hint")) or ""
    if "hint" in raw and not hint:
        problems.add("must be a non-empty string (a nudge shown after a wrong answer) or left out", qid, "hint")

    question: Question | None = None
    if qtype in ("single", "multiple"):
        options = _parse_options(raw.get("options"), qid, problems)
        ids = [o.id for o in options]
        answer = raw.get("answer")
        if qtype == "single":
            if not isinstance(answer, str) or answer not in ids:
                problems.add(f"must be one option id out of [{', '.join(ids)}], got {answer!r}", qid, "answer")
            else:
                question = SingleChoice(qid, section, prompt or "", explanation or "", options, answer, hint=hint)
        else:
            if (not isinstance(answer, list) or not answer
                    or any(not isinstance(a, str) or a not in ids for a in answer)):
                problems.add(f"must be a non-empty list of option ids out of [{', '.join(ids)}], got {answer!r}",
                             qid, "answer")
            elif len(set(answer)) != len(answer):
                problems.add("lists an option twice", qid, "answer")
            else:
                question = MultipleChoice(qid, section, prompt or "", explanation or "", options,
                                          frozenset(answer), hint=hint)
    elif qtype == "numeric":
        answer, tolerance, unit = raw.get("answer"), raw.get("tolerance", 0), raw.get("unit", "")
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
            problems.add(f"must be a finite number, got {answer!r}", qid, "answer")
        elif isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
            problems.add(f"must be a number >= 0, got {tolerance!r}", qid, "tolerance")
        elif not isinstance(unit, str):
            problems.add(f"must be a string, got {unit!r}", qid, "unit")
        else:
            question = Numeric(qid, section, prompt or "", explanation or "", float(answer), float(tolerance),
                               unit.strip(), hint=hint)
    else:
        accept, patterns = raw.get("accept", []), raw.get("patterns", [])
        compiled = []
        if not isinstance(accept, list) or any(_text(a) is None for a in accept):
            problems.add("must be a list of non-empty strings", qid, "accept")
            accept = []
        if not isinstance(patterns, list) or any(not isinstance(p, str) for p in patterns):
            problems.add("must be a list of regular expressions (strings)", qid, "patterns")
            patterns = []
        for pattern in patterns:
            try:
                compiled.append(re.compile(pattern, re.IGNORECASE))
            except re.error as exc:
                problems.add(f"invalid regular expression {pattern!r}: {exc}", qid, "patterns")
        if not accept and not patterns:
            problems.add("a short answer needs 'accept' and/or 'patterns'", qid, "accept")
        else:
            question = ShortAnswer(qid, section, prompt or "", explanation or "",
                                   tuple(a.strip() for a in accept), tuple(compiled), hint=hint)
    return question if len(problems.items) == before else None


def parse_bank(data: Any, path: Path | str, section: str | None = None) -> Bank:
    """Validate already-parsed YAML ``data``; ``section`` defaults to the file stem."""
    problems = _Problems(path)
    expected = section or Path(path).stem
    if not isinstance(data, Mapping):
        problems.add(f"must be a mapping with {', '.join(_BANK_FIELDS)}, got {type(data).__name__}")
        raise BankError(problems.items)
    for name in data:
        if name not in _BANK_FIELDS:
            problems.add(f"unknown top-level field (allowed: {', '.join(_BANK_FIELDS)})", field=str(name))
    if not _SECTION_RE.match(expected):
        problems.add(f"bank files must be named NN-<slug>.yaml, got {Path(path).name!r}")
    if data.get("section") != expected:
        problems.add(f"must equal the file stem {expected!r}, got {data.get('section')!r}", field="section")
    title = _text(data.get("title"))
    if title is None:
        problems.add("must be a non-empty string", field="title")
    description = data.get("description", "")
    if not isinstance(description, str):
        problems.add("must be a string", field="description")
        description = ""
    raw_questions = data.get("questions")
    questions: list[Question] = []
    if not isinstance(raw_questions, list) or not raw_questions:
        problems.add("must be a non-empty list", field="questions")
    else:
        seen: set[str] = set()
        for index, raw in enumerate(raw_questions):
            question = _parse_question(raw, expected, index, problems)
            if question is None:
                continue
            if question.id in seen:
                problems.add("duplicate question id", question.id, "id")
            seen.add(question.id)
            questions.append(question)
    if problems.items:
        raise BankError(problems.items)
    return Bank(expected, title or "", tuple(questions), Path(path), description.strip())


def load_bank(path: str | os.PathLike[str]) -> Bank:
    """Load and validate one bank file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BankError([f"{path}: cannot read: {exc}"]) from exc
    except yaml.YAMLError as exc:
        raise BankError([f"{path}: not valid YAML: {exc}"]) from exc
    return parse_bank(data, path)


def load_all(directory: str | os.PathLike[str] | None = None) -> dict[str, Bank]:
    """Load every ``NN-*.yaml`` bank, in section order; question ids must be unique across banks."""
    directory = Path(directory) if directory is not None else quiz_dir()
    paths = sorted(directory.glob("[0-9][0-9]-*.yaml"))
    if not paths:
        raise BankError([f"{directory}: no question banks (NN-<slug>.yaml) found"])
    banks: dict[str, Bank] = {}
    problems: list[str] = []
    owner: dict[str, str] = {}
    for path in paths:
        try:
            bank = load_bank(path)
        except BankError as exc:
            problems.extend(exc.problems)
            continue
        for q in bank.questions:
            if q.id in owner:
                problems.append(f"{path}: question {q.id!r}: field 'id': already used in section {owner[q.id]!r}")
            owner.setdefault(q.id, bank.section)
        banks[bank.section] = bank
    if problems:
        raise BankError(problems)
    return banks


def resolve_section(section: str | int, sections: Iterable[str]) -> str:
    """Map ``4``, ``"04"``, ``"sharing"`` or ``"04-sharing"`` to a section name."""
    names = list(sections)
    key = str(section).strip()
    if key in names:
        return key
    if key.isdigit():
        matches = [n for n in names if int(n[:2]) == int(key)]
    else:
        matches = [n for n in names if n[3:] == key]
    if len(matches) == 1:
        return matches[0]
    raise KeyError(f"unknown quiz section {section!r}; available: {', '.join(names)}")


def load_section(section: str | int, directory: str | os.PathLike[str] | None = None) -> Bank:
    """Load the bank for one section, named as accepted by :func:`resolve_section`."""
    directory = Path(directory) if directory is not None else quiz_dir()
    names = [p.stem for p in sorted(directory.glob("[0-9][0-9]-*.yaml"))]
    return load_bank(directory / f"{resolve_section(section, names)}.yaml")
