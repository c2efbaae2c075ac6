"""Does the check model score, give partial credit, survive broken checks and keep hidden checks hidden?"""

from __future__ import annotations

import copy
import textwrap

import pytest
from grading_support import example_checks

from gpulab.grading.checks import (
    HIDDEN_FAILED,
    Check,
    CheckLoadError,
    CheckResult,
    CheckSuite,
    Context,
    check,
    dig,
    failed,
    group_by_kind,
    judge_diagnosis,
    load_hidden_checks,
    load_lab_checks,
    partial,
    passed,
    quantity_int,
    ratio,
    run_check,
)

NODE = {"kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {"node-role.kubernetes.io/ai": "true"}},
        "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "2"}}}
CPU_NODE = {"kind": "Node", "metadata": {"name": "cpu-node-1"}, "status": {"allocatable": {"cpu": "8"}}}
GOOD_JOB = {
    "kind": "Job", "metadata": {"name": "gpu-train-demo", "namespace": "ns1"},
    "spec": {"backoffLimit": 2, "activeDeadlineSeconds": 600, "template": {"spec": {
        "restartPolicy": "Never",
        "nodeSelector": {"node-role.kubernetes.io/ai": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "train", "image": "cuda",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    "status": {"succeeded": 1},
}
GOOD_VALUES = {"allocatable_gpus": {"gpu-node-1": 2}, "train_log": "GPU 0: ...\ntrain step done\n"}


def _ctx(values=None, objects=(NODE, CPU_NODE, GOOD_JOB)):
    return Context.from_objects(copy.deepcopy(list(objects)), dict(GOOD_VALUES if values is None else values), "ns1")


def test_result_helpers_validate():
    assert passed().passed and passed().fraction == 1.0
    assert failed("缺了 limits").fraction == 0.0
    assert partial(0.5, "一半").fraction == 0.5
    with pytest.raises(ValueError):
        failed("")  # withholding points requires a reason
    with pytest.raises(ValueError):
        CheckResult(1.5)
    assert ratio(2, 3, ["少了一项"]).fraction == pytest.approx(2 / 3)
    assert ratio(3, 3, []).passed


def test_check_decorator_and_points():
    @check("one", points=3, title="标题")
    def one(ctx):
        return partial(0.5, "只做对了一半")

    assert isinstance(one, Check) and one.points == 3.0 and one.title == "标题"
    outcome = run_check(one, Context())
    assert outcome.earned == 1.5 and not outcome.passed and outcome.message == "只做对了一半"
    with pytest.raises(ValueError):
        check("Bad Id")(lambda ctx: passed())
    with pytest.raises(ValueError):
        check("zero", points=0)(lambda ctx: passed())


def test_a_result_marked_for_review_carries_its_clauses_and_withheld_points_to_the_outcome():
    @check("explain", points=3, title="解释")
    def explain(ctx):
        return CheckResult(1 / 3, "你写的「显存被平分了」——是说……吗？", review=["显存被平分了"], withheld=2 / 3)

    outcome = run_check(explain, Context())
    assert outcome.earned == 1 and outcome.withheld == 2 and outcome.review == ("显存被平分了",)
    assert not outcome.passed and outcome.message.startswith("你写的「显存被平分了」")
    hidden = run_check(check("h", points=3, hidden=True)(explain.func), Context())
    assert hidden.review == ("显存被平分了",) and "显存" not in hidden.message  # the instructor's, not the learner's
    final = run_check(check("plain")(lambda ctx: partial(0.5, "一半")), Context())
    assert final.review == () and final.withheld == 0
    with pytest.raises(ValueError, match="review is empty"):
        CheckResult(0.0, "扣了", withheld=0.5)  # nothing to review
    with pytest.raises(ValueError, match="withheld"):
        CheckResult(0.5, "扣了", review=("x",), withheld=0.75)  # more than was taken
    with pytest.raises(ValueError, match="tell the learner"):
        CheckResult(1.0, "", review=("x",))
    with pytest.raises(ValueError, match="non-empty strings"):
        CheckResult(0.5, "扣了", review=("",))


def test_context_queries_return_copies():
    ctx = _ctx()
    assert [n["metadata"]["name"] for n in ctx.objects("node")] == ["gpu-node-1", "cpu-node-1"]
    assert ctx.objects("Node", labels={"node-role.kubernetes.io/ai": "true"})[0]["metadata"]["name"] == "gpu-node-1"
    assert ctx.object("Job", "gpu-train-demo", "ns1")["status"]["succeeded"] == 1
    assert ctx.object("Job", "gpu-train-demo", "other") is None
    ctx.object("Job", "gpu-train-demo")["status"]["succeeded"] = 0  # a check mutating its copy...
    assert ctx.object("Job", "gpu-train-demo")["status"]["succeeded"] == 1  # ...does not affect the next one
    assert ctx.value("missing", None) is None


def test_missing_value_and_object_produce_learner_messages():
    @check("needs-value")
    def needs_value(ctx):
        ctx.value("replicas")
        return passed()

    @check("needs-job")
    def needs_job(ctx):
        ctx.require("Job", "absent")
        return passed()

    value_outcome = run_check(needs_value, Context(namespace="ns1"))
    assert value_outcome.earned == 0 and "replicas" in value_outcome.message and value_outcome.error is None
    job_outcome = run_check(needs_job, Context(namespace="ns1"))
    assert "Job `absent`" in job_outcome.message and "ns1" in job_outcome.message


def test_a_broken_check_scores_zero_and_is_reported_to_the_instructor():
    @check("broken", points=2)
    def broken(ctx):
        return ctx.values["x"]["y"]

    @check("returns-bool")
    def returns_bool(ctx):
        return True

    out = run_check(broken, Context(values={"x": 1}))
    assert out.earned == 0 and out.error and "TypeError" in out.error
    assert "没能完成" in out.message and "TypeError" not in out.message
    assert "expected CheckResult" in run_check(returns_bool, Context()).error


def test_suite_rejects_duplicate_ids():
    a = check("same")(lambda ctx: passed())
    with pytest.raises(CheckLoadError, match="duplicate"):
        CheckSuite("x", (a, a))


def test_example_lab_full_marks():
    suite = example_checks()
    outcomes = suite.run(_ctx())
    assert [o.check_id for o in outcomes] == [c.id for c in suite.checks]
    assert all(o.passed for o in outcomes), [(o.check_id, o.message) for o in outcomes]
    assert sum(o.earned for o in outcomes) == suite.max_points == 10


def test_example_lab_partial_credit_and_hints_without_answers():
    job = copy.deepcopy(GOOD_JOB)
    spec = job["spec"]["template"]["spec"]
    del spec["tolerations"]
    spec["restartPolicy"] = "OnFailure"
    del job["spec"]["activeDeadlineSeconds"]
    job["status"] = {"failed": 3}
    values = {"allocatable_gpus": {"gpu-node-1": 2, "cpu-node-1": 0}, "train_log": "nothing"}
    outcomes = {o.check_id: o for o in example_checks().run(_ctx(values, (NODE, CPU_NODE, job)))}
    assert outcomes["job-placement"].earned == 1  # selector right, toleration missing: half of 2
    assert "污点" in outcomes["job-placement"].message
    assert "NoSchedule" not in outcomes["job-placement"].message  # hints, never the answer
    assert outcomes["job-bounded"].earned == pytest.approx(0.67)
    assert outcomes["job-succeeded"].earned == 0 and "kubectl logs" in outcomes["job-succeeded"].message
    assert outcomes["allocatable-recorded"].earned == 0 and "标签不等于资源" in outcomes["allocatable-recorded"].message
    assert outcomes["job-gpu-limit"].passed


def test_example_lab_without_anything_recorded():
    outcomes = example_checks().run(Context(namespace="ns1"))
    assert sum(o.earned for o in outcomes) == 0
    assert all(o.message for o in outcomes) and not any(o.error for o in outcomes)


SECRET_TITLE = "检查 Pod 的 nvidia.com/gpu 必须是 1 张的秘密条件"
SECRET_MESSAGE = "秘密提示：答案是 replicas=4"


def _hidden_dir(tmp_path):
    d = tmp_path / "hidden"
    d.mkdir()
    (d / "lab_example_hidden.py").write_text(textwrap.dedent(f'''
        from gpulab.grading.checks import check, failed, passed
        LAB = "example"

        @check("secret-replicas", points=3, title="{SECRET_TITLE}")
        def secret(ctx):
            return failed("{SECRET_MESSAGE}")

        @check("secret-ok", points=1)
        def ok(ctx):
            return passed("秘密通过说明")
    '''), encoding="utf-8")
    (d / "other_lab.py").write_text(textwrap.dedent('''
        from gpulab.grading.checks import check, failed
        LAB = "07-monitoring"

        @check("not-for-this-lab")
        def other(ctx):
            return failed("x")
    '''), encoding="utf-8")
    return d


def test_hidden_checks_are_loaded_per_lab_and_never_leak(tmp_path):
    hidden = load_hidden_checks(_hidden_dir(tmp_path), lab="example")
    assert [c.id for c in hidden] == ["secret-replicas", "secret-ok"] and all(c.hidden for c in hidden)
    suite = example_checks().with_hidden(hidden)
    assert suite.max_points == 14
    outcomes = {o.check_id: o for o in suite.run(_ctx())}
    secret = outcomes["secret-replicas"]
    assert secret.label == "隐藏检查 1" and secret.message == HIDDEN_FAILED and secret.earned == 0
    assert outcomes["secret-ok"].label == "隐藏检查 2" and outcomes["secret-ok"].earned == 1
    learner_facing = " ".join(f"{o.label} {o.message}" for o in outcomes.values())
    assert SECRET_TITLE not in learner_facing and SECRET_MESSAGE not in learner_facing
    assert "秘密通过说明" not in learner_facing
    assert secret.detail == SECRET_MESSAGE  # instructors still see the real message


def test_hidden_check_errors_stay_generic(tmp_path):
    d = tmp_path / "h"
    d.mkdir()
    (d / "boom.py").write_text("from gpulab.grading.checks import check\n"
                               "@check('boom')\ndef boom(ctx):\n    raise RuntimeError('secret internals')\n")
    outcome = example_checks().with_hidden(load_hidden_checks(d)).run(Context())[-1]
    assert outcome.message == HIDDEN_FAILED and "secret" not in outcome.message and "secret internals" in outcome.error


def test_broken_hidden_file_is_an_instructor_error(tmp_path):
    d = tmp_path / "h"
    d.mkdir()
    (d / "bad.py").write_text("this is not python\n")
    with pytest.raises(CheckLoadError, match="bad.py"):
        load_hidden_checks(d)
    with pytest.raises(CheckLoadError, match="does not exist"):
        load_hidden_checks(tmp_path / "nope")


def test_unknown_lab_and_file_labs(tmp_path):
    with pytest.raises(CheckLoadError, match="lab_42"):
        load_lab_checks("42-nothing")
    path = tmp_path / "mylab.py"
    path.write_text("from gpulab.grading.checks import check, passed\n@check('a')\ndef a(ctx):\n    return passed()\n")
    assert load_lab_checks(path).lab == "mylab"


def test_helpers():
    assert dig(GOOD_JOB, "spec", "template", "spec", "containers", 0, "name") == "train"
    assert dig(GOOD_JOB, "spec", "nope", "x", default=5) == 5
    assert [quantity_int(v) for v in ("2", 2, 2.0, "0.5", 0.5, True, "1Gi")] == [2, 2, 2, None, None, None, None]
    grouped = group_by_kind([{"kind": "List", "items": [{"kind": "Pod"}, {"kind": "Pod"}]}, {"kind": "Job"}])
    assert {k: len(v) for k, v in grouped.items()} == {"Pod": 2, "Job": 1}


def test_a_diagnosis_passes_on_the_broken_part_and_otherwise_says_what_was_named_with_the_mix_ups_hint():
    names = {"a": "甲层", "b": "乙层"}
    hints = {("a", "b"): "看看乙层的日志。"}
    kw = dict(field="broken_layer", wrong="坏的不是「{name}」这一层。", default_hint="逐层核对。")
    assert judge_diagnosis("b", "b", names, hints, **kw).fraction == 1.0
    wrong = judge_diagnosis("a", "b", names, hints, **kw)
    assert (wrong.fraction, wrong.message) == (0.0, "坏的不是「甲层」这一层。看看乙层的日志。")
    assert judge_diagnosis("b", "a", names, hints, **kw).message == "坏的不是「乙层」这一层。逐层核对。"
    assert judge_diagnosis("c", "a", names, hints, **kw).message == "broken_layer 应该是 a, b 之一。"
