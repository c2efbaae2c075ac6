"""Do the shipped question banks load, and does validation name what is wrong?"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from gpulab.quiz import bank as qb
from gpulab.quiz.bank import (
    GENERIC_HINTS,
    BankError,
    MultipleChoice,
    Numeric,
    ShortAnswer,
    SingleChoice,
    format_number,
    grade_answer,
    load_all,
    load_bank,
    load_section,
    normalize,
)

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["01-resource-model", "02-gpu-operator", "03-scheduling", "04-sharing", "05-training", "06-inference",
            "07-monitoring-cost", "08-troubleshooting", "09-self-test"]


@pytest.fixture(scope="module")
def banks():
    return load_all(REPO / "quizzes")


def test_every_section_has_a_bank(banks):
    assert list(banks) == SECTIONS


@pytest.mark.parametrize("section", SECTIONS)
def test_bank_size_and_text(banks, section):
    bank = banks[section]
    # A lesson's quiz is short (three to seven questions: 07 walks the longest chain); the self-test is ten.
    limit = 10 if section == "09-self-test" else 7
    assert 3 <= len(bank.questions) <= limit
    assert bank.title
    for q in bank.questions:
        assert q.id and q.prompt.strip()
        # An explanation teaches: it is more than a verdict.
        assert len(q.explanation) >= 40, q.id


def test_every_key_grades_as_correct(banks):
    """The key itself must be accepted, and a wrong answer rejected, for every question."""
    for bank in banks.values():
        for q in bank.questions:
            if isinstance(q, SingleChoice):
                key, wrong = q.answer, next(o.id for o in q.options if o.id != q.answer)
            elif isinstance(q, MultipleChoice):
                key, wrong = sorted(q.answer), [o.id for o in q.options if o.id not in q.answer][:1] or ["zz"]
            elif isinstance(q, Numeric):
                key, wrong = q.answer, q.answer + q.tolerance + 1
            else:
                assert isinstance(q, ShortAnswer)
                key, wrong = (q.accept[0] if q.accept else None), "完全无关的答案 xyz"
                if key is None:
                    continue
            assert grade_answer(q, key).correct, q.id
            assert not grade_answer(q, wrong).correct, q.id


def _plain(text: str) -> str:
    """Bank text as a learner reads it: full-width folded, no `code`/**bold** marks, spaces collapsed."""
    return " ".join(re.sub(r"[`*]", "", unicodedata.normalize("NFKC", text)).split())


def test_every_question_has_a_hint_of_its_own_that_does_not_give_the_key(banks):
    """A wrong answer gets the question's own hint, never a generic one and never the key in other words."""
    seen: dict[str, str] = {}
    for bank in banks.values():
        for q in bank.questions:
            hint = _plain(q.hint)
            assert hint, f"{q.id}: no hint"
            assert q.hint.strip() not in GENERIC_HINTS.values(), f"{q.id}: generic hint"
            assert hint not in seen, f"{q.id}: same hint as {seen.get(hint)}"
            seen[hint] = q.id
            if isinstance(q, (SingleChoice, MultipleChoice)):
                keys = [q.answer] if isinstance(q, SingleChoice) else sorted(q.answer)
                for key in keys:
                    text = _plain(q.option(key).text)
                    assert text not in hint, f"{q.id}: hint quotes key option {key.upper()} {text!r}"
            elif isinstance(q, Numeric):
                number = re.escape(format_number(q.answer))
                assert not re.search(rf"(?<![\d.]){number}(?!\d|\.\d)", hint), f"{q.id}: hint states {number}"
            else:
                assert isinstance(q, ShortAnswer)
                assert not any(normalize(a) in normalize(hint) for a in q.accept), f"{q.id}: hint quotes the key"
                assert not grade_answer(q, hint).correct, f"{q.id}: the hint itself is accepted as the answer"


def test_all_question_types_are_used(banks):
    kinds = {q.kind for b in banks.values() for q in b.questions}
    assert kinds == {"single", "multiple", "numeric", "short"}


def test_question_ids_are_globally_unique(banks):
    ids = [q.id for b in banks.values() for q in b.questions]
    assert len(ids) == len(set(ids))


def test_chapter_facts_are_keyed_as_the_chapter_states(banks):
    sharing = banks["04-sharing"]
    assert sharing.question("sh-mig-count").answer == 7
    assert grade_answer(sharing.question("sh-mig-resource-name"), "nvidia.com/mig-1g.10gb").correct
    ts = sharing.question("sh-ts-facts")
    # time-slicing does not isolate memory: the option claiming isolation must not be in the key
    isolated = next(o.id for o in ts.options if "只能看到属于自己的那一份显存" in o.text)
    assert isolated not in ts.answer
    quota = banks["07-monitoring-cost"].question("mon-quota-key")
    assert grade_answer(quota, "requests.nvidia.com/gpu").correct
    rules = banks["01-resource-model"].question("rm-quantity-rules")
    assert grade_answer(rules, ["a", "b", "c"]).correct  # fraction, requests≠limits, no limits
    hpa = banks["09-self-test"].question("st-hpa-resources")
    assert grade_answer(hpa, "CPU 和 内存").correct
    assert not grade_answer(hpa, "cpu 和 nvidia.com/gpu").correct


def test_load_section_accepts_number_and_slug():
    assert load_section(4, REPO / "quizzes").section == "04-sharing"
    assert load_section("04", REPO / "quizzes").section == "04-sharing"
    assert load_section("sharing", REPO / "quizzes").section == "04-sharing"
    with pytest.raises(KeyError, match="available"):
        load_section("99", REPO / "quizzes")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_schema_errors_name_file_question_field_and_allowed(tmp_path):
    path = _write(tmp_path, "01-demo.yaml", """
section: 01-demo
title: 演示
questions:
  - id: q-one
    type: single
    prompt: 问题
    options: {a: 甲, b: 乙}
    answer: c
    explanation: 解释
  - id: q-two
    type: numeric
    prompt: 问题
    answer: 3
    tolerance: -1
    explanation: 解释
  - id: q-three
    type: essay
    prompt: 问题
    explanation: 解释
  - id: q-four
    type: short
    prompt: 问题
    patterns: ['(unclosed']
    explanation: 解释
    optoins: typo
""")
    with pytest.raises(BankError) as info:
        load_bank(path)
    problems = info.value.problems
    text = "\n".join(problems)
    assert f"{path}: question 'q-one': field 'answer': must be one option id out of [a, b], got 'c'" in problems
    assert "question 'q-two': field 'tolerance': must be a number >= 0" in text
    assert "question 'q-three': field 'type': must be one of single, multiple, numeric, short" in text
    assert "question 'q-four': field 'patterns': invalid regular expression" in text
    assert "question 'q-four': field 'optoins': unknown field for a short question (allowed:" in text
    assert all(p.startswith(str(path)) for p in problems)


def test_section_must_match_file_name_and_explanation_is_required(tmp_path):
    path = _write(tmp_path, "02-demo.yaml", """
section: 03-other
title: 演示
questions:
  - id: q
    type: short
    prompt: 问题
    accept: [x]
""")
    with pytest.raises(BankError) as info:
        load_bank(path)
    text = str(info.value)
    assert "field 'section': must equal the file stem '02-demo'" in text
    assert "question 'q': field 'explanation'" in text


def test_duplicate_ids_across_banks_are_rejected(tmp_path):
    body = "title: t\nquestions:\n  - {id: same, type: short, prompt: p, accept: [x], explanation: e}\n"
    _write(tmp_path, "01-a.yaml", "section: 01-a\n" + body)
    _write(tmp_path, "02-b.yaml", "section: 02-b\n" + body)
    with pytest.raises(BankError, match="already used in section '01-a'"):
        load_all(tmp_path)


def test_invalid_yaml_is_reported_with_the_file(tmp_path):
    path = _write(tmp_path, "01-bad.yaml", "section: [unclosed\n")
    with pytest.raises(BankError, match="01-bad.yaml: not valid YAML"):
        load_bank(path)


def test_quiz_dir_can_be_overridden(monkeypatch, tmp_path):
    monkeypatch.setenv("GPULAB_QUIZ_DIR", str(tmp_path))
    assert qb.quiz_dir() == tmp_path


def test_optional_hint_is_loaded_and_validated(tmp_path):
    path = _write(tmp_path, "01-demo.yaml", """
section: 01-demo
title: 演示
questions:
  - id: q-hinted
    type: single
    prompt: 问题
    options: {a: 甲, b: 乙}
    answer: a
    hint: 回到「资源模型」一节再看一遍。
    explanation: 解释
  - id: q-plain
    type: short
    prompt: 问题
    accept: [x]
    explanation: 解释
""")
    bank = load_bank(path)
    assert bank.question("q-hinted").hint == "回到「资源模型」一节再看一遍。"
    assert bank.question("q-plain").hint == ""
    bad = _write(tmp_path, "02-demo.yaml", """
section: 02-demo
title: 演示
questions:
  - {id: q-empty, type: short, prompt: 问题, accept: [x], explanation: 解释, hint: "  "}
  - {id: q-list, type: numeric, prompt: 问题, answer: 1, explanation: 解释, hint: [a, b]}
""")
    with pytest.raises(BankError) as info:
        load_bank(bad)
    text = str(info.value)
    assert "question 'q-empty': field 'hint': must be a non-empty string" in text
    assert "question 'q-list': field 'hint': must be a non-empty string" in text
