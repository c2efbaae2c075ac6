"""Feedback that is true: each check's message says what it saw, and each mistake costs points once.

Every test builds the Context a learner's submission would leave behind in one situation where a check
used to say something the captured objects did not show (or deducted a second time for a mistake another
check already judged), and asserts the message and score it gives now. Explanations are scored on what
they claim: a clause that seems to assert a known-wrong mechanism or remedy is quoted back as a question,
never as an assertion, and marked for the instructor's review, its shares withheld until then (that the
reference solutions' texts earn full marks is tests/unit/test_grading_labs.py's, which may read solutions/;
right explanations written in many ways are tests/unit/test_grading_explanations.py's).
"""

from __future__ import annotations

from grading_support import TIME_SLICING, TIME_SLICING_MISPLACED

import re

import pytest

from gpulab.grading.checks import Context, WrongClaim, asserted, judge_explanation
from gpulab.grading.labs import lab_01, lab_03, lab_04, lab_05, lab_06, lab_08

# --------------------------------------------------------------------------- the shared explanation scorer


@pytest.mark.parametrize("text, claimed", [
    ("调度器发现 GPU 资源不够。", "调度器发现 GPU 资源不够"),
    ("不是因为资源不够，而是因为污点。", None),  # denied, not claimed
    ("It is not because the GPUs are insufficient.", None),
    ("另外两台节点 GPU 不够，GPU 节点有污点。", None),  # a clause about the other nodes (``unless``)
    ("GPU 并没有不够", None),  # denied inside the match: 没 is not what the pattern asks for
    ("资源还是不够用，GPU 节点有污点。", "资源还是不够用"),  # 不 is the claim itself: "not enough" is what it says
])
def test_asserted_reads_claims_not_words(text, claimed):
    pattern = re.compile(r"(GPU|资源).{0,6}不够|insufficient", re.I)
    assert asserted(text, pattern, unless=re.compile("另外")) == claimed


def test_wrong_claims_are_asked_about_and_withhold_two_shares_or_one_for_review():
    concepts = [(re.compile("甲"), "缺甲"), (re.compile("乙"), "缺乙"), (re.compile("丙"), "缺丙")]
    wrong = [WrongClaim(re.compile("错因"), "原因是错因", "再看看日志。"),
             WrongClaim(re.compile("错招"), "用错招能修好", "这一招修的是什么？", kind="remedy")]
    def score(text):
        return judge_explanation(text, concepts, wrong, min_chars=5)

    right = score("甲乙丙，全都说到了，没有错误")
    assert right.fraction == 1 and right.review == () and right.withheld == 0
    remedy = score("甲乙丙都对，但是要用错招来修")
    assert remedy.fraction == pytest.approx(2 / 3) and remedy.withheld == pytest.approx(1 / 3)
    assert remedy.review == ("但是要用错招来修",)
    # quoted and asked, never asserted
    assert remedy.message == ("解释里写的「但是要用错招来修」——是说用错招能修好吗？如果是这个意思，这一招修的是什么？"
                              "如果不是，这一条会交给老师复核。")
    mechanism = score("甲乙丙都说了，可根子是错因")
    assert mechanism.fraction == pytest.approx(1 / 3) and mechanism.withheld == pytest.approx(2 / 3)
    assert score("甲乙丙都说了，根子不是错因").passed  # denied, not claimed
    both = score("只有甲，外加错因和错招")
    assert both.fraction == 0 and both.withheld == pytest.approx(1 / 3)  # never below zero: only the 甲 is at stake
    assert both.review == ("外加错因和错招",)  # one clause, asked about once
    assert both.message.startswith("缺乙；缺丙。解释里写的「外加错因和错招」——是说原因是错因吗？")
    assert "至少十几个字" in judge_explanation("甲乙丙", concepts, wrong).message
    with pytest.raises(ValueError, match="kind"):
        WrongClaim(re.compile("x"), "x", "x。", kind="aside")
    with pytest.raises(ValueError, match="reading"):
        WrongClaim(re.compile("x"), "原因是错因吗？", "再看看日志。")
    with pytest.raises(ValueError, match="hint"):
        WrongClaim(re.compile("x"), "原因是错因", "再看看日志")


# --------------------------------------------------------------------------- lab 01: a MIG request is a GPU request


def _pod01(name, limits, node=None):
    want = lab_01.original(name)["spec"]["containers"][0]
    spec = {"containers": [{"name": "cuda", "image": want["image"], "command": want["command"],
                            "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def _node01(alloc):
    return {"kind": "Node", "metadata": {"name": "gpu-node-1"}, "status": {"allocatable": alloc}}


def test_lab01_a_mig_request_is_named_not_called_no_gpu():
    pod = _pod01("gpu-half", {"nvidia.com/mig-1g.10gb": 1})
    result = lab_01.fix_gpu_half(Context.from_objects([pod, _node01({"nvidia.com/gpu": "2"})], namespace="ns"))
    assert result.fraction == 0
    assert "没有申请任何 GPU" not in result.message
    assert "申请的是 nvidia.com/mig-1g.10gb: 1" in result.message and "MIG 实例" in result.message
    assert "没有节点上报这种资源，gpu-half 停在 Pending" in result.message
    # Where a node does offer the slice, the message does not claim otherwise.
    offered = lab_01.fix_gpu_half(Context.from_objects(
        [_pod01("gpu-half", {"nvidia.com/mig-1g.10gb": 1}, node="gpu-node-1"),
         _node01({"nvidia.com/mig-1g.10gb": "7"})], namespace="ns"))
    assert "MIG 实例" in offered.message and "没有节点上报" not in offered.message
    # No NVIDIA resource at all is still "no GPU".
    assert "没有申请任何 GPU" in lab_01.fix_gpu_half(Context.from_objects([_pod01("gpu-half", {})], namespace="ns")).message


# --------------------------------------------------------------------------- lab 03: an unscheduled Pod


def _tolerant(toleration, node=None):
    spec = {"nodeSelector": {lab_03.AI_LABEL: "true"}, "tolerations": [toleration],
            "containers": [{"name": "nginx", "image": "nginx:1.27"}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": "web-tolerant", "namespace": "ns"}, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def _gpu_node03():
    return {"kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {}},
            "status": {"capacity": {"nvidia.com/gpu": "2"}}}


FAILED_SCHEDULING = {"kind": "Event", "metadata": {"name": "e", "namespace": "ns"}, "reason": "FailedScheduling",
                     "involvedObject": {"name": "web-tolerant"},
                     "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}
GOOD_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_lab03_an_unscheduled_pod_and_an_empty_record_do_not_differ():
    ctx = Context.from_objects([_gpu_node03(), _tolerant(GOOD_TOLERATION), FAILED_SCHEDULING],
                               values={"tolerant_node": None}, namespace="ns")
    result = lab_03.tolerant_pod(ctx)
    # Not scheduled costs the placement criterion once; recording "nowhere" reads the Pod right.
    assert result.fraction == pytest.approx(2 / 3)
    assert "不一致" not in result.message
    assert "web-tolerant 没有被调度（Pending，spec.nodeName 为空" in result.message
    assert "didn't match Pod's node affinity/selector" in result.message  # what the scheduler said
    # A wrong toleration as well: one more criterion, still no complaint about the record.
    bad = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}
    carol = lab_03.tolerant_pod(Context.from_objects([_gpu_node03(), _tolerant(bad)],
                                                      values={"tolerant_node": None}, namespace="ns"))
    assert carol.fraction == pytest.approx(1 / 3) and "tolerant_node" not in carol.message
    assert "也没有调度失败的事件" in carol.message
    # Recording a node the Pod is not on is a wrong reading, and the message says what was recorded.
    wrong = lab_03.tolerant_pod(Context.from_objects([_gpu_node03(), _tolerant(GOOD_TOLERATION)],
                                                      values={"tolerant_node": "gpu-node-1"}, namespace="ns"))
    assert wrong.fraction == pytest.approx(1 / 3)
    assert "tolerant_node 记录的是 'gpu-node-1'，可 web-tolerant 没有被调度到任何节点" in wrong.message
    placed = lab_03.tolerant_pod(Context.from_objects([_gpu_node03(), _tolerant(GOOD_TOLERATION, "gpu-node-1")],
                                                       values={"tolerant_node": "gpu-node-1"}, namespace="ns"))
    assert placed.passed


def test_lab03_explanation_is_scored_on_its_mechanism():
    def result(text):
        return lab_03.explanation(Context({"explanation": text}))

    # A false mechanism that names the scheduler used to earn 1/3; the scheduler's share is withheld for review.
    false = result("调度器发现 GPU 节点上的资源不够，所以没有把 web-plain 放上去。")
    assert false.fraction == 0 and false.withheld == pytest.approx(1 / 3)
    assert false.review == ("调度器发现 GPU 节点上的资源不够",)
    assert "「调度器发现 GPU 节点上的资源不够」——是说 GPU 节点是因为资源不够才被排除的吗？" in false.message
    # Naming the scheduler is not saying what it decided.
    assert result("节点有污点，Pod 没有容忍，调度器把它放到了别的地方。").fraction == pytest.approx(2 / 3)
    assert result("节点有污点，web-plain 没有容忍，调度器过滤时排除了这台节点，它被驱逐了。").fraction == pytest.approx(1 / 3)
    # Denying a wrong mechanism is not asserting it; the other nodes really lack the label.
    assert result("GPU 节点有污点，web-plain 没有容忍，调度器过滤掉了它；不是因为资源不够，另外两台节点 GPU 不够。").passed


# --------------------------------------------------------------------------- lab 04: dev phase and MIG count

TS = TIME_SLICING
TS_MISPLACED = TIME_SLICING_MISPLACED


def _ev(i, reason, obj, message, ns="g-dev"):
    return {"kind": "Event", "metadata": {"name": f"e{i}", "namespace": ns}, "reason": reason,
            "involvedObject": {"name": obj}, "message": message}


def _dev(config, scaled_to, placed, refused=0, policy_name="time-slicing-config", alloc=None):
    """A lab-04 submission after its dev phase: the stack as configured, and the dev namespace's events."""
    objects = [
        {"kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2", "nvidia.com/device-plugin.config": "any"}},
         "status": {"allocatable": alloc or {"nvidia.com/gpu": "2"}}},
        {"kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
         "spec": {"devicePlugin": {"config": {"name": policy_name, "default": "any"}}}},
        {"kind": "ConfigMap", "metadata": {"name": "time-slicing-config", "namespace": "gpu-operator"},
         "data": {"any": config}},
        {"kind": "Deployment", "metadata": {"name": "dev-notebooks", "namespace": "g-dev"},
         "spec": {"template": {"spec": {"containers": [{"name": "notebook",
                                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}},
        _ev("c", "ScalingReplicaSet", "dev-notebooks", "Scaled up replica set dev-notebooks-7f from 0 to 1"),
    ]
    if scaled_to > 1:
        objects.append(_ev("s", "ScalingReplicaSet", "dev-notebooks",
                           f"Scaled up replica set dev-notebooks-7f from 1 to {scaled_to}"))
    objects += [_ev(f"p{i}", "Scheduled", f"nb-{i}", f"Successfully assigned g-dev/nb-{i} to gpu-node-1")
                for i in range(placed)]
    objects += [_ev(f"f{i}", "FailedScheduling", f"nb-q{i}", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
                for i in range(refused)]
    return objects


def test_lab04_filling_what_the_config_offered_is_not_shares_unused():
    # replicas: 2 → the node offers 4 shares; the learner reads allocatable and scales to 4, all placed.
    ctx = Context.from_objects(_dev(TS.format(n=2), 4, 4), namespace="g")
    assert lab_04.ts_config(ctx).fraction == pytest.approx(2 / 3)  # the per-card count costs points here …
    fit = lab_04.dev_fit(ctx)
    assert fit.fraction == 1  # … and only here
    assert "还有份额空着" not in fit.message
    assert "正好用满了节点报出的份数" in fit.message and "2 张卡每张报 2 份，共 4 份" in fit.message
    # Shares the config offered and the learner left unused are still unused.
    under = lab_04.dev_fit(Context.from_objects(_dev(TS.format(n=2), 2, 2), namespace="g"))
    assert under.fraction == pytest.approx(2 / 3) and "还有份额空着" in under.message and "共 4 份" in under.message
    # The lab's own config: the old judgement, and no number handed out.
    right = lab_04.dev_fit(Context.from_objects(_dev(TS.format(n=4), 2, 2), namespace="g"))
    assert right.fraction == pytest.approx(2 / 3) and "还有份额空着" in right.message and "共 8 份" not in right.message
    assert lab_04.dev_fit(Context.from_objects(_dev(TS.format(n=4), 8, 8), namespace="g")).passed
    over = lab_04.dev_fit(Context.from_objects(_dev(TS.format(n=2), 8, 4, refused=4), namespace="g"))
    assert over.fraction == pytest.approx(1 / 3) and "多于节点能给的份数" in over.message


def test_lab04_config_never_applied_means_whole_cards():
    ctx = Context.from_objects(_dev(TS.format(n=4), 2, 2, policy_name=""), namespace="g")
    assert lab_04.ts_applied(ctx).fraction < 1
    fit = lab_04.dev_fit(ctx)
    assert fit.passed and "没有给 device plugin 指定配置" in fit.message and "共 2 份" in fit.message


def test_lab04_an_unreadable_config_is_not_deducted_again_downstream():
    ctx = Context.from_objects(_dev(TS_MISPLACED, 1, 0, refused=1), values={"seen_memory_mib": 0}, namespace="g")
    assert lab_04.ts_config(ctx).fraction == 0
    fit = lab_04.dev_fit(ctx)
    assert fit.passed and "device plugin 读不懂" in fit.message and "不再扣分" in fit.message
    assert "最多扩到了 1 个" in fit.message and "FailedScheduling" in fit.message
    seen = lab_04.dev_sees_neighbours(ctx)
    assert seen.passed and "只有 0 个笔记本被调度到 GPU 节点上" in seen.message


def test_lab04_neighbours_are_judged_where_the_run_shared_cards():
    def seen(value, placed):
        return lab_04.dev_sees_neighbours(Context.from_objects(_dev(TS.format(n=4), 8, placed),
                                                               values={"seen_memory_mib": value}, namespace="g"))

    assert seen(4 * 12288, 8).passed
    shared = seen(12288, 8)
    assert shared.fraction == 0 and "8 个笔记本被调度到 GPU 节点的 2 张卡上" in shared.message
    odd = seen(5000, 8)
    assert odd.fraction == 0 and "5000 MiB 不是若干个笔记本用量" in odd.message and "没有超出" not in odd.message


def _infer(resource, alloc, strategy="mixed", state="success"):
    return [
        {"kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2", "nvidia.com/mig.config": "all-1g.10gb",
            "nvidia.com/mig.config.state": state}}, "status": {"allocatable": alloc}},
        {"kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"}, "spec": {"mig": {"strategy": strategy}}},
        {"kind": "Deployment", "metadata": {"name": "infer-small", "namespace": "g-infer"},
         "spec": {"template": {"spec": {"containers": [{"name": "infer",
                                                          "resources": {"limits": {resource: 1}}}]}}}},
    ]


def test_lab04_mig_count_reads_the_node_zero_included():
    # mig.strategy left at single: the slices are advertised as nvidia.com/gpu, none as the resource asked for.
    single = _infer("nvidia.com/mig-1g.10gb", {"nvidia.com/gpu": "14"}, strategy="single")
    assert lab_04.mig_layout(Context.from_objects(single, namespace="g")).fraction < 1  # judged there
    zero = lab_04.mig_count(Context.from_objects(single, values={"mig_instances": 0}, namespace="g"))
    assert zero.passed and "allocatable 里没有 nvidia.com/mig-1g.10gb" in zero.message
    offered = _infer("nvidia.com/mig-1g.10gb", {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14"})
    missed = lab_04.mig_count(Context.from_objects(offered, values={"mig_instances": 0}, namespace="g"))
    assert missed.fraction == 0 and "有推理副本申请的 nvidia.com/mig-1g.10gb" in missed.message
    assert "并没有上报" not in missed.message
    assert lab_04.mig_count(Context.from_objects(offered, values={"mig_instances": 14}, namespace="g")).passed
    assert "对不上" in lab_04.mig_count(Context.from_objects(offered, values={"mig_instances": 7}, namespace="g")).message


def test_lab04_explanation_is_scored_on_its_mechanism():
    def result(text):
        return lab_04.explanation(Context({"explanation": text}))

    split = result("time-slicing 把显存平均分给每个容器，大家轮流用算力，一个容器 OOM 不影响别人；MIG 也可以。")
    assert split.fraction == 0 and split.withheld == 1  # all four parts said: all at stake
    assert split.review == ("time-slicing 把显存平均分给每个容器", "一个容器 OOM 不影响别人")
    assert "「time-slicing 把显存平均分给每个容器」——是说 time-slicing 把显存分开了吗？" in split.message
    assert "「一个容器 OOM 不影响别人」——是说一个容器 OOM 不会波及同一张卡上的其它容器吗？" in split.message
    limits = result("time-slicing 轮流用算力，显存共享，一个 OOM 邻居一起挂；要隔离就给每个容器设 limits 限制显存。")
    assert limits.fraction == pytest.approx(2 / 4) and limits.withheld == pytest.approx(1 / 4)
    assert "是说用 limits/requests 就能限住显存吗？" in limits.message
    # A clause about MIG isolating memory is right, not a claim about time-slicing.
    assert result("MIG 把显存切分成独立实例；time-slicing 只轮流分算力，显存共享，一个 OOM 邻居一起挂。").passed
    # Denied between the noun and the verb, in Chinese and English; MIG named in another clause of its sentence.
    for right in ("time-slicing 只是让几个容器轮流用算力，显存并没有切开，一个容器 OOM，同卡的邻居也跟着挂；要隔离用 MIG。",
                  "Time-slicing only takes turns on compute and the memory is not split, so one container's OOM "
                  "takes its neighbours down; MIG, by contrast, partitions memory in hardware."):
        judged = result(right)
        assert judged.passed, judged.message
        assert "显存分开了" not in judged.message


# --------------------------------------------------------------------------- lab 05: a deadline with no room to retry


T0 = "2025-01-01T00:00:00Z"


def _job05(deadline, backoff=2, failed_reason=None):
    job = {"kind": "Job", "metadata": {"name": "train", "namespace": "ns"},
           "spec": {"backoffLimit": backoff, "template": {"spec": {"restartPolicy": "Never",
                                                                   "containers": [{"name": "train"}]}}},
           "status": {"startTime": T0}}
    if deadline is not None:
        job["spec"]["activeDeadlineSeconds"] = deadline
    if failed_reason:
        job["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": failed_reason}]
    return job


def _attempt05(name, finished, exit_code=1, created=T0, phase="Failed"):
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": {"job-name": "train"},
                                        "creationTimestamp": created},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "train", "state": {"terminated": {"exitCode": exit_code, "finishedAt": finished}}}]}}


def test_lab05_a_deadline_inside_the_retry_backoff_is_backoff_limit_zero():
    def bounded(*objects):
        return lab_05.job_bounded(Context.from_objects(list(objects), namespace="ns"))

    short = bounded(_job05(10, failed_reason="DeadlineExceeded"), _attempt05("train-a", "2025-01-01T00:00:03Z"))
    assert short.fraction == pytest.approx(2 / 3)
    assert "activeDeadlineSeconds 只有 10 秒" in short.message and "backoffLimit: 0" in short.message
    assert "第一次尝试在 Job 开始约 3 秒后失败" in short.message and "退避 10 秒" in short.message
    # backoffLimit: 0 costs the same share.
    assert bounded(_job05(300, backoff=0), _attempt05("train-a", "2025-01-01T00:00:03Z")).fraction == \
        pytest.approx(2 / 3)
    # Judged without a run as well: the back-off alone outlasts a 10 s deadline.
    assert "放不下一次重试" in bounded(_job05(10)).message
    # Room for the back-off and a second run of the same length.
    assert bounded(_job05(20), _attempt05("train-a", "2025-01-01T00:00:03Z")).passed
    assert bounded(_job05(300), _attempt05("train-a", "2025-01-01T00:00:03Z")).passed
    assert "总时长上限" in bounded(_job05(None)).message


def test_lab05_a_job_killed_by_its_deadline_is_not_sent_to_the_second_attempts_log():
    ctx = Context.from_objects([_job05(10, failed_reason="DeadlineExceeded"),
                                _attempt05("train-a", "2025-01-01T00:00:03Z")], namespace="ns")
    result = lab_05.resumed_after_failure(ctx)
    assert result.fraction == 0
    assert "第二次是从哪里开始的" not in result.message
    assert "Job 失败了（DeadlineExceeded）" in result.message and "只有 1 个 Pod" in result.message
    assert "activeDeadlineSeconds（10 秒）" in result.message
    assert "成功的那次尝试" not in result.message and "没有一次尝试成功" in result.message


def test_lab05_a_retry_that_started_over_is_quoted_from_its_log():
    pods = [_attempt05("train-a", "2025-01-01T00:00:03Z", created="2025-01-01T00:00:00Z"),
            _attempt05("train-b", "2025-01-01T00:00:16Z", created="2025-01-01T00:00:13Z")]
    log = {"kind": "PodLog", "metadata": {"name": "train-b", "namespace": "ns"}, "container": "train",
           "log": "dataset: 3 shards in /data\nno checkpoint found, starting from step 0\n"}
    result = lab_05.resumed_after_failure(Context.from_objects(
        [_job05(300, backoff=1, failed_reason="BackoffLimitExceeded"), *pods, log], namespace="ns"))
    assert "Job 失败了（BackoffLimitExceeded），2 个 Pod" in result.message
    assert "第 2 次尝试的日志写着 no checkpoint found" in result.message


def test_lab05_attempts_recorded_against_what_the_pods_show():
    ctx = Context.from_objects([_job05(10, failed_reason="DeadlineExceeded"),
                                _attempt05("train-a", "2025-01-01T00:00:03Z")],
                               values={"failed_attempts": 1, "resumed_step": None}, namespace="ns")
    assert lab_05.attempts_recorded(ctx).passed  # nothing resumed, and None says so
    missing = lab_05.attempts_recorded(Context.from_objects([_attempt05("train-a", "2025-01-01T00:00:03Z")],
                                                            namespace="ns"))
    assert missing.fraction == 0 and "没有记录 failed_attempts" in missing.message
    assert "不一致" not in missing.message


# --------------------------------------------------------------------------- lab 06: why the replicas restarted


def _llm_pod(last_terminated=None, restarts=1):
    status = {"name": "server", "restartCount": restarts}
    if last_terminated:
        status["lastState"] = {"terminated": last_terminated}
    return {"kind": "Pod", "metadata": {"name": "llm-a", "namespace": "g", "labels": {"app": "llm"}},
            "status": {"phase": "Running", "containerStatuses": [status],
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _llm_deploy(probe=None):
    container = {"name": "server", "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}
    if probe is not None:
        container["startupProbe"] = probe
    return {"kind": "Deployment", "metadata": {"name": "llm", "namespace": "g"},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}


def test_lab06_an_oom_kill_is_not_called_a_probe_failure():
    oom = _llm_pod({"reason": "OOMKilled", "exitCode": 137})
    result = lab_06.ready(Context.from_objects([_llm_deploy(), oom], namespace="g"))
    assert result.fraction == 0.5
    assert "OOMKilled" in result.message and "exit code 137" in result.message and "探针失败了" not in result.message
    unhealthy = {"kind": "Event", "metadata": {"name": "u", "namespace": "g"}, "reason": "Unhealthy",
                 "involvedObject": {"name": "llm-a"}, "message": "Startup probe failed: connection refused"}
    probed = lab_06.ready(Context.from_objects([_llm_deploy(), _llm_pod({"reason": "Error", "exitCode": 137}),
                                                unhealthy], namespace="g"))
    assert "Startup probe failed: connection refused" in probed.message
    killed = lab_06.ready(Context.from_objects([_llm_deploy(), _llm_pod({"reason": "Error", "exitCode": 137})],
                                               namespace="g"))
    assert "退出码是 137" in killed.message and "事件里没有探针失败" in killed.message
    assert lab_06.ready(Context.from_objects([_llm_deploy(), _llm_pod(restarts=0)], namespace="g")).passed


def test_lab06_budget_hint_names_only_fields_really_left_out():
    full = {"httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 0, "periodSeconds": 5,
            "failureThreshold": 24}
    set_all = lab_06.budget_recorded(Context.from_objects([_llm_deploy(full)], values={"startup_budget_seconds": 100},
                                                          namespace="g"))
    assert set_all.fraction == 0 and "默认值" not in set_all.message and "三个字段都写了" in set_all.message
    partial_probe = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5, "failureThreshold": 24}
    unset = lab_06.budget_recorded(Context.from_objects([_llm_deploy(partial_probe)],
                                                        values={"startup_budget_seconds": 100}, namespace="g"))
    assert "它没写 initialDelaySeconds" in unset.message and "默认值" in unset.message
    assert lab_06.budget_recorded(Context.from_objects([_llm_deploy(partial_probe)],
                                                       values={"startup_budget_seconds": 120}, namespace="g")).passed


# --------------------------------------------------------------------------- lab 08: explanations


@pytest.mark.parametrize("pod, text, fraction, quoted", [
    # A wrong remedy on a right mechanism used to earn 2/2.
    ("infer", "驱动和镜像里的 CUDA 运行时版本不兼容，把镜像换成最新的 CUDA 就行。", 2 / 3, "把镜像换成最新的 CUDA 就行"),
    ("infer", "驱动版本太新了，和镜像里 CUDA 运行时的版本不兼容。", 1 / 3, "驱动版本太新了"),
    ("train", "有张卡报了 Xid，allocatable 少了一张，是 device plugin 上报的；卡也被别的任务占满了。", 1 / 3,
     "卡也被别的任务占满了"),
    ("dev-notebook", "调度器发现 GPU 节点上卡不够，所以 dev-notebook 只能等。", 0, "调度器发现 GPU 节点上卡不够"),
])
def test_lab08_explanations_with_wrong_claims_await_review(pod, text, fraction, quoted):
    result = lab_08._explain(Context({"explanations": {pod: text}}), pod)
    assert result.fraction == pytest.approx(fraction) and result.review == (quoted,)
    assert f"{pod} 的解释里写的「{quoted}」——是说" in result.message
    assert "吗？如果是这个意思，" in result.message and result.message.endswith("如果不是，这一条会交给老师复核。")
