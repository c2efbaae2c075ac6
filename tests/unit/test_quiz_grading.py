"""Does grade_answer judge each question type, with the normalisation learners expect?"""

from __future__ import annotations

import re

import pytest

from gpulab.quiz.bank import (
    GENERIC_HINTS,
    MultipleChoice,
    Numeric,
    Option,
    ShortAnswer,
    SingleChoice,
    canonical_answer,
    format_number,
    grade_answer,
    hint_for,
    key_lines,
    normalize,
)

OPTS = (Option("a", "甲"), Option("b", "乙"), Option("c", "丙"), Option("d", "丁"))
SINGLE = SingleChoice("s", "01-x", "单选？", "因为乙是对的，甲丙丁都不对。", OPTS, "b")
MULTI = MultipleChoice("m", "01-x", "多选？", "甲和丙对。", OPTS, frozenset({"a", "c"}))
NUM = Numeric("n", "01-x", "几个？", "七个。", 7.0, 0.0, "个")
NUM_TOL = Numeric("t", "01-x", "约多少？", "约 0.5。", 0.5, 0.05)
SHORT = ShortAnswer("q", "01-x", "资源名？", "nvidia.com/gpu 是扩展资源。", ("nvidia.com/gpu", "Device Plugin"),
                    (re.compile(r"requests\.nvidia\.com/gpu\s*=\s*\d+", re.I),))


def test_single_choice():
    fb = grade_answer(SINGLE, "b")
    assert fb.correct and fb.answered and fb.explanation == SINGLE.explanation
    assert grade_answer(SINGLE, "B").correct  # option ids are case-insensitive
    wrong = grade_answer(SINGLE, "a")
    assert not wrong.correct and wrong.answered and wrong.explanation  # wrong answers are explained too
    assert "回答错误" in wrong.message


@pytest.mark.parametrize("value", [None, "", []])
def test_unanswered_reveals_nothing(value):
    for q in (SINGLE, MULTI):
        fb = grade_answer(q, value)
        assert not fb.answered and not fb.correct and fb.explanation == ""


def test_single_rejects_unknown_and_several_options():
    assert not grade_answer(SINGLE, "e").answered
    assert "没有这个选项" in grade_answer(SINGLE, "e").message
    assert not grade_answer(SINGLE, ["a", "b"]).answered


@pytest.mark.parametrize("answer,correct,fragment", [
    (["a", "c"], True, "回答正确"),
    (["c", "a"], True, "回答正确"),
    ("a,c", True, "回答正确"),
    ("a、c", True, "回答正确"),
    ("AC", True, "回答正确"),
    (["a"], False, "漏选"),
    (["a", "b", "c"], False, "多选"),
    (["b", "d"], False, "既有选错的，也有漏选的"),
])
def test_multiple_choice(answer, correct, fragment):
    fb = grade_answer(MULTI, answer)
    assert fb.correct is correct and fragment in fb.message


@pytest.mark.parametrize("answer,correct", [
    (7, True), (7.0, True), ("7", True), ("７", True), (" 7 个", True), (6, False), (7.5, False),
])
def test_numeric(answer, correct):
    assert grade_answer(NUM, answer).correct is correct


def test_numeric_tolerance_and_invalid_input():
    assert grade_answer(NUM_TOL, 0.54).correct
    assert grade_answer(NUM_TOL, 0.45).correct
    assert not grade_answer(NUM_TOL, 0.56).correct
    for bad in ("七", "", None, True, float("nan")):
        assert not grade_answer(NUM, bad).answered


@pytest.mark.parametrize("answer", [
    "nvidia.com/gpu", "NVIDIA.COM/GPU", "  nvidia.com/gpu  ", "ｎｖｉｄｉａ．ｃｏｍ／ｇｐｕ", "`nvidia.com/gpu`",
    "“nvidia.com/gpu”", "nvidia.com/gpu。", "device plugin", "device-plugin", "Device　Plugin",
    "requests.nvidia.com/gpu = 4", "ＲＥＱＵＥＳＴＳ.nvidia.com/gpu=4",
])
def test_short_answer_normalisation(answer):
    assert grade_answer(SHORT, answer).correct, answer


@pytest.mark.parametrize("answer", ["nvidia.com/gpus", "gpu", "requests.nvidia.com/gpu = x"])
def test_short_answer_rejects(answer):
    fb = grade_answer(SHORT, answer)
    assert fb.answered and not fb.correct


def test_normalize():
    assert normalize("  Ｎｏ　Ｓｃｈｅｄｕｌｅ\t ") == "no schedule"
    assert normalize("「镜像不对」。") == "镜像不对"


def test_canonical_answer_is_what_gets_saved():
    assert canonical_answer(SINGLE, "B") == "b"
    assert canonical_answer(MULTI, "c,a") == ["a", "c"]
    assert canonical_answer(NUM, "７") == 7.0
    assert canonical_answer(SHORT, "Device Plugin") == "Device Plugin"


def test_wrong_answers_get_a_hint_that_does_not_give_the_key():
    wrong = grade_answer(SINGLE, "a")
    assert wrong.message == "回答错误：A 不是正确答案。" and wrong.hint == GENERIC_HINTS["single"]
    assert "乙" not in wrong.message + wrong.hint and "B" not in wrong.message
    assert grade_answer(MULTI, ["a"]).hint == GENERIC_HINTS["multiple"]
    assert grade_answer(SHORT, "gpu").hint == GENERIC_HINTS["short"]
    assert grade_answer(SINGLE, "b").hint == ""  # right answers need no hint
    assert grade_answer(SINGLE, "").hint == ""  # nor do non-answers
    assert all(h.startswith("再想想") for h in GENERIC_HINTS.values())


def test_numeric_says_too_big_or_too_small():
    big, small = grade_answer(NUM, 9), grade_answer(NUM, "6")
    assert big.message == "数值不对：偏大了。" and small.message == "数值不对：偏小了。"
    assert big.hint == GENERIC_HINTS["numeric"] and "7" not in big.message + big.hint


def test_a_question_hint_replaces_the_generic_one():
    hinted = SingleChoice("h", "01-x", "单选？", "乙对。", OPTS, "b", hint="想想 **乙** 的定义。")
    assert hint_for(hinted) == "想想 **乙** 的定义。"
    assert grade_answer(hinted, "c").hint == "想想 **乙** 的定义。"
    assert hint_for(SINGLE) == GENERIC_HINTS["single"]


def test_key_lines_spell_out_the_key():
    assert key_lines(SINGLE) == ["B. 乙"]
    assert key_lines(MULTI) == ["A. 甲", "C. 丙"]
    assert key_lines(NUM) == ["7 个"]
    assert key_lines(NUM_TOL) == ["0.5（允许误差 ±0.05）"]
    assert key_lines(SHORT) == ["`nvidia.com/gpu`", "也接受：`Device Plugin`"]
    assert key_lines(ShortAnswer("p", "01-x", "?", "e", (), (re.compile("x"),))) == ["（按规则判分，写法见解析）"]
    assert format_number(7.0) == "7" and format_number(0.25) == "0.25"
