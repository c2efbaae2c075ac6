"""The check model: small pure functions over a :class:`Context`, with points.

A lab's checks live in a module (``gpulab/grading/labs/lab_NN.py``)::

    from gpulab.grading.checks import check, failed, passed, partial

    @check("job-gpu-limit", points=2, title="训练 Job 申请了 1 张 GPU")
    def job_gpu_limit(ctx):
        job = ctx.object("Job", "gpu-train-demo")
        if job is None:
            return failed("命名空间里没有找到名为 gpu-train-demo 的 Job。")
        ...
        return passed()

A check sees only plain data: the values the notebook recorded
(``ctx.values``) and API objects captured from the submission's namespace
(``ctx.objects("Pod")``), so it can be unit-tested with JSON fixtures and never
talks to a cluster. It returns a :class:`CheckResult`: full, partial or no
credit, and a zh-CN message that says what is wrong and hints at why — never
the answer.

Hidden checks are ordinary check modules kept outside the repository and
loaded with :func:`load_hidden_checks`; learners only ever see
"隐藏检查 N：未通过/通过", never their title, message or code.

Each mistake costs points once. A *step check* judges one thing the learner
did (a value read off the cluster, a number chosen, a Deployment scaled)
against what their own earlier steps actually produced, as captured, not
against the lab's target: when an earlier step went wrong and another check
deducts for that, the step is judged against what the learner really had
(error carried forward), and the message says what was observed and which
check covers the cause. When the captured objects cannot tell what the earlier
step produced, that criterion is not judged and not deducted; the message says
so. *Outcome checks* (the lab's end state: replicas running, a Job resumed)
judge the end state as it is, and their messages name the cause they saw.
Each check's docstring says which kind it is where that matters.

Free-text explanations are scored on what they claim (:func:`judge_explanation`):
each concept of the right mechanism earns its share. Where the text seems to
assert a known-wrong mechanism or remedy, reading prose by pattern may be
wrong, so the result is marked for the instructor's review (as nbgrader marks
manually graded answers): :attr:`CheckResult.review` quotes the clauses, the
shares the claim would take back are withheld until the instructor decides
(:attr:`CheckResult.withheld`), and the learner's message quotes the clause and
asks what it means — it never says the learner claimed it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import importlib.util
import math
import re
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

_CHECK_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_MISSING = object()

HIDDEN_PASSED = "隐藏检查通过。"
HIDDEN_PARTIAL = "隐藏检查部分通过。"
HIDDEN_FAILED = "隐藏检查未通过。"


class CheckLoadError(Exception):
    """Raised when a check module cannot be found, imported or is inconsistent."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CheckResult:
    """What a check returns: the fraction of its points earned and a learner-facing message.

    ``review``: what the instructor should read before the score stands — the clauses of a learner's
    answer a check could not judge for sure (:func:`judge_explanation` quotes those that seem to assert a
    wrong claim); empty when the result is final. ``withheld``: the fraction of the points withheld until
    the instructor has looked: if the learner did not mean what the check read, it is theirs, on top of
    ``fraction``. A result marked for review must say so to the learner (``message``).
    """

    fraction: float
    message: str = ""
    review: tuple[str, ...] = ()
    withheld: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.fraction, (int, float)) or isinstance(self.fraction, bool) \
                or not math.isfinite(self.fraction) or not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"CheckResult.fraction must be within [0, 1], got {self.fraction!r}")
        if self.fraction < 1.0 and not self.message.strip():
            raise ValueError("a check that withholds points must say why (message is empty)")
        object.__setattr__(self, "review", tuple(self.review))
        if not all(isinstance(item, str) and item.strip() for item in self.review):
            raise ValueError(f"CheckResult.review must hold non-empty strings, got {self.review!r}")
        if not isinstance(self.withheld, (int, float)) or isinstance(self.withheld, bool) \
                or not math.isfinite(self.withheld) or not 0.0 <= self.withheld <= 1.0 - self.fraction + 1e-9:
            raise ValueError(f"CheckResult.withheld must be within [0, 1 - fraction], got {self.withheld!r}")
        if self.withheld > 0 and not self.review:
            raise ValueError("points withheld for review need something to review (review is empty)")
        if self.review and not self.message.strip():
            raise ValueError("a result marked for review must tell the learner (message is empty)")

    @property
    def passed(self) -> bool:
        return self.fraction >= 1.0


def passed(message: str = "") -> CheckResult:
    """Full credit."""
    return CheckResult(1.0, message)


def failed(message: str) -> CheckResult:
    """No credit; ``message`` says what is wrong and hints at why."""
    return CheckResult(0.0, message)


def partial(fraction: float, message: str) -> CheckResult:
    """Part of the points (``0 <= fraction <= 1``)."""
    return CheckResult(float(fraction), message)


def ratio(satisfied: int, total: int, problems: Sequence[str], ok_message: str = "") -> CheckResult:
    """Credit for ``satisfied`` of ``total`` criteria; ``problems`` are joined into the message."""
    if total <= 0:
        raise ValueError("ratio() needs at least one criterion")
    if satisfied >= total:
        return passed(ok_message)
    return CheckResult(max(0, satisfied) / total, "；".join(problems) if problems else "部分要求没有满足。")


def judge_diagnosis(answer: Any, truth: str, names: Mapping[str, str], hints: Mapping[tuple[str, str], str], *,
                    field: str, wrong: str, default_hint: str) -> CheckResult:
    """A learner's diagnosis of which part broke (a layer, a link of a pipeline): full marks when ``answer`` names
    ``truth``; otherwise what they named, in ``wrong`` (``{name}``: its name in ``names``), and the hint for that
    mix-up (``hints[(answer, truth)]``, else ``default_hint``), which points at what to look at, never at the answer.
    ``field``: the recorded value's name, for an answer that is none of ``names``."""
    if answer not in names:
        return failed(f"{field} 应该是 {', '.join(names)} 之一。")
    if answer == truth:
        return passed()
    return failed(wrong.format(name=names[answer]) + hints.get((answer, truth), default_hint))


class MissingValue(KeyError):
    """Raised by :meth:`Context.value` when the notebook did not record ``name``."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name
        self.message = (f"没有找到笔记本记录的结果 `{name}`：确认笔记本运行到了调用 "
                        f"`gpulab.grading.record(\"{name}\", …)` 的单元格，并且那之前没有出错。")


class MissingObject(LookupError):
    """Raised by :meth:`Context.require` when an API object is absent."""

    def __init__(self, kind: str, name: str, namespace: str | None):
        super().__init__(f"{kind}/{name}")
        where = f"命名空间 {namespace} 里" if namespace else "集群里"
        self.message = f"{where}没有找到 {kind} `{name}`：确认它是在这次运行里创建的，名字也和要求一致。"


# --------------------------------------------------------------------------- context


@dataclass
class Context:
    """Everything a check may look at, as plain data.

    ``values``: name → JSON value recorded by the notebook with ``record()``.
    ``resources``: kind → list of API objects (``kubectl get -o json`` items)
    captured from the submission's namespace, plus any cluster-scoped kinds the
    collector adds (``Node``, ``PriorityClass`` …).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    resources: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    namespace: str | None = None
    execution: Any = None

    def __post_init__(self) -> None:
        self._by_kind = {kind.lower(): list(objs) for kind, objs in self.resources.items()}

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]], values: Mapping[str, Any] | None = None,
                     namespace: str | None = None, execution: Any = None) -> Context:
        """Build a context from a flat list of objects (each with ``kind``)."""
        return cls(values or {}, group_by_kind(objects), namespace, execution)

    def has(self, name: str) -> bool:
        return name in self.values

    def value(self, name: str, default: Any = _MISSING) -> Any:
        """A recorded value (a deep copy); raises :class:`MissingValue` unless ``default`` is given."""
        if name in self.values:
            return copy.deepcopy(self.values[name])
        if default is _MISSING:
            raise MissingValue(name)
        return default

    def objects(self, kind: str, namespace: str | None = None,
                labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Captured objects of ``kind`` (case-insensitive), optionally filtered; deep copies."""
        found = []
        for obj in self._by_kind.get(kind.lower(), []):
            meta = obj.get("metadata") or {}
            if namespace is not None and meta.get("namespace") != namespace:
                continue
            if labels and any((meta.get("labels") or {}).get(k) != v for k, v in labels.items()):
                continue
            found.append(copy.deepcopy(dict(obj)))
        return found

    def object(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object of ``kind`` called ``name``, or None."""
        for obj in self.objects(kind, namespace):
            if (obj.get("metadata") or {}).get("name") == name:
                return obj
        return None

    def require(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """Like :meth:`object` but raises :class:`MissingObject` (reported to the learner) when absent."""
        obj = self.object(kind, name, namespace)
        if obj is None:
            raise MissingObject(kind, name, namespace or self.namespace)
        return obj


def group_by_kind(objects: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``[{"kind": "Pod", …}, …]`` or a ``kind: List`` → ``{"Pod": […]}``."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        if obj.get("kind") == "List" or (obj.get("kind", "").endswith("List") and "items" in obj):
            for kind, items in group_by_kind(obj.get("items") or []).items():
                grouped.setdefault(kind, []).extend(items)
            continue
        kind = obj.get("kind")
        if not kind:
            raise ValueError(f"object without kind: {str(obj)[:120]}")
        grouped.setdefault(kind, []).append(dict(obj))
    return grouped


# --------------------------------------------------------------------------- helpers for check authors


def dig(obj: Any, *path: Any, default: Any = None) -> Any:
    """``dig(job, "spec", "template", "spec", "containers", 0, "name")`` without KeyErrors."""
    current = obj
    for key in path:
        try:
            current = current[key]
        except (KeyError, IndexError, TypeError):
            return default
        if current is None:
            return default
    return current


def pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec inside a Pod, Job, CronJob or any workload with ``spec.template``."""
    kind = obj.get("kind")
    if kind == "Pod":
        return dig(obj, "spec", default={})
    if kind == "CronJob":
        return dig(obj, "spec", "jobTemplate", "spec", "template", "spec", default={})
    return dig(obj, "spec", "template", "spec", default={})


def containers(obj: Mapping[str, Any], include_init: bool = False) -> list[dict[str, Any]]:
    """Containers of a Pod or workload (optionally with initContainers first)."""
    spec = pod_spec(obj)
    found = list(spec.get("initContainers") or []) if include_init else []
    return found + list(spec.get("containers") or [])


def quantity_int(value: Any) -> int | None:
    """``"2"`` or ``2`` → 2; anything that is not a whole number → None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        return int(value)
    return None


# --------------------------------------------------------------------------- free-text explanations


#: Where one claim of a free-text answer ends: sentence and clause punctuation, Chinese or English.
_CLAUSE_END = re.compile(r"[。；;！!？?\n，,：:、（）()]|\.(?:\s|$)")
#: Where a sentence ends: what a clause is about ("MIG, by contrast, partitions memory") may be named
#: in another clause of its sentence. A sentence ending in a question mark asks; it claims nothing.
_SENTENCE_END = re.compile(r"[。；;！!？?\n]|\.(?:\s|$)")
_QUESTION_MARKS = ("？", "?")
#: Words that deny what follows them ("不是因为资源不够", "not because ...", "nothing was evicted") or hold it
#: up as a supposition or a belief said to be mistaken ("如果…", "误以为…", "if ...", "a misconception that
#: ..."), and how far back they reach: a few characters in Chinese, a few words in English.
_NEGATION = re.compile(r"不(?!仅|只|但)|没(?!错)|未|无(?!论)|并非|而非|绝非|如果|假如|假设|(?<!可)以为|误认为", re.I)
_NEGATION_EN = re.compile(r"\bnot\b|n't\b|\bno\b|\bnever\b|\bnor\b|\bnothing\b|\bnobody\b|\bno one\b|"
                          r"\bnone\b|\bneither\b|rather than|instead of|\bif\b|\bwhether\b|misconception|"
                          r"\bmyth\b|mistaken|wrongly", re.I)
_NEGATION_WINDOW = 12
_NEGATION_WINDOW_EN = 32
#: Where a negation's reach ends before the claim: a contrast or a consequence starts a claim of its own
#: ("不是轮流用算力而是把显存平分", "doesn't isolate compute but memory is split").
_SCOPE_END = re.compile(r"而是|但是|但|却|可是|不过|然而|所以|因此|因而|于是")
_SCOPE_END_EN = re.compile(r"\b(?:but|while|whereas|although|though|however|yet|so|therefore|hence)\b", re.I)
#: Words right after a claim that say it is wrong ("把显存平分给每个容器是错的", "... is a myth").
_REFUTED = re.compile(r"^.{0,8}?(是错(的|误的)|就错了|是不对的|不正确|不成立|是误解|是一种误解|是个误解|说法不对)|"
                      r"^.{0,12}?\b(is|are|was|were|that's|that is)\s+(wrong|false|incorrect|a myth|a misconception|"
                      r"not true|not the case)\b|^.{0,12}?\b(isn't|aren't|wasn't) (true|the case)\b", re.I)
_REFUTED_WINDOW = 24


def clauses(text: str) -> list[str]:
    """``text`` cut into clauses at sentence and clause punctuation (empty ones dropped)."""
    return [c.strip() for c in _CLAUSE_END.split(text) if c.strip()]


def _pieces(text: str, boundary: re.Pattern[str]) -> list[tuple[int, str, str]]:
    """``text`` cut at ``boundary``: each non-empty piece with its offset in ``text`` and the boundary after it."""
    found, start = [], 0
    for cut in [*boundary.finditer(text), None]:
        end = cut.start() if cut else len(text)
        piece = text[start:end]
        if piece.strip():
            found.append((start + len(piece) - len(piece.lstrip()), piece.strip(), cut.group() if cut else ""))
        start = cut.end() if cut else len(text)
    return found


def _negated_before(clause: str, start: int) -> bool:
    """Whether a negation word stands shortly before ``start`` in ``clause``, with no contrast between."""
    for negation, scope_end, window in ((_NEGATION, _SCOPE_END, _NEGATION_WINDOW),
                                        (_NEGATION_EN, _SCOPE_END_EN, _NEGATION_WINDOW_EN)):
        before = clause[max(0, start - window):start]
        cut = max((end.end() for end in scope_end.finditer(before)), default=0)
        if negation.search(before[cut:]):
            return True
    return False


def _denied(clause: str, match: re.Match[str]) -> bool:
    """Whether a negation word denies ``match``: shortly before it in its clause (不、没、如果 … in the 12
    characters before, not/never/if … in the 32, unless a contrast such as 而是 or "but" stands between),
    or inside it, between the noun and the verb a pattern joins ("显存并没有切开", "the memory is not split").
    A negation inside is a denial only where the pattern does not need it: in "资源不够" the 不 is what is
    claimed (without it there is no match)."""
    if _negated_before(clause, match.start()):
        return True
    inside = match.group()
    for negation in (_NEGATION, _NEGATION_EN):
        for word in negation.finditer(inside):
            if match.re.search(inside[:word.start()] + inside[word.end():]):
                return True
    return False


def asserted(text: str, pattern: re.Pattern[str], unless: re.Pattern[str] | None = None) -> str | None:
    """The first clause of ``text`` that says ``pattern`` without denying it, or None.

    What a text claims, not which words it uses: a match is not a claim where a negation word stands before
    it in its clause or inside it (:func:`_denied`: "并没有把显存切开", "显存并没有切开", "the memory is not
    split", "nothing was evicted"), where it is supposed or called a mistaken belief ("如果…", "误以为…",
    "if ..."), where the words right after it call it wrong ("…是错的", "... is a myth"), or where its
    sentence is a question ("显存会被切开吗？"). Sentences matching ``unless`` are skipped, all their clauses
    (a claim about MIG is not a claim about time-slicing, also where MIG is named in another clause:
    "MIG, by contrast, partitions memory").
    """
    for _at, sentence, end in _pieces(text, _SENTENCE_END):
        if end in _QUESTION_MARKS or (unless is not None and unless.search(sentence)):
            continue
        for offset, clause, _end in _pieces(sentence, _CLAUSE_END):
            for match in pattern.finditer(clause):
                after = sentence[offset + match.end():offset + match.end() + _REFUTED_WINDOW]
                if not _denied(clause, match) and not _REFUTED.search(after):
                    return clause
    return None


@dataclass(frozen=True)
class WrongClaim:
    """A known-wrong mechanism or remedy an explanation may assert, and what to ask the learner about it.

    A clause matching ``pattern`` is quoted back to the learner with a question, never an assertion
    (:func:`judge_explanation`): ``reading`` is what the check reads the clause as saying, worded to complete
    「是说……吗？」 ("time-slicing 把显存分开了"); ``hint`` is where to look if that is what the learner
    meant, a sentence or question of its own ending in 。 or ？ ("你从容器里用 nvidia-smi 看到的已用显存是多少？"),
    saying what to look at, never the answer. ``kind`` sets what asserting it would cost: a wrong
    ``"mechanism"`` two shares (it stands in for a part of the right mechanism, and it is false), a wrong
    ``"remedy"`` one.
    """

    pattern: re.Pattern[str]
    reading: str
    hint: str
    unless: re.Pattern[str] | None = None
    kind: str = "mechanism"

    def __post_init__(self) -> None:
        if self.kind not in WRONG_CLAIM_COST:
            raise ValueError(f"WrongClaim.kind must be one of {sorted(WRONG_CLAIM_COST)}, got {self.kind!r}")
        if not self.reading.strip() or self.reading.strip()[-1] in "。？！，；：?!.,;:":
            raise ValueError(f"WrongClaim.reading completes 「是说……吗？」: no closing punctuation, got {self.reading!r}")
        if not self.hint.strip().endswith(("。", "？")):
            raise ValueError(f"WrongClaim.hint is a sentence of its own, ending in 。 or ？, got {self.hint!r}")

    def question(self, subject: str, clause: str) -> str:
        """What the learner is asked about ``clause`` of their ``subject``: what it says, never what they meant."""
        reading = self.reading.strip()
        before, after = (" " if reading[0].isascii() else ""), (" " if reading[-1].isascii() else "")
        return (f"{subject}里写的「{clause}」——是说{before}{reading}{after}吗？如果是这个意思，{self.hint.strip()}"
                f"如果不是，这一条会交给老师复核。")


#: Shares of an explanation's credit an asserted wrong claim takes back, by kind.
WRONG_CLAIM_COST = {"mechanism": 2, "remedy": 1}


def judge_explanation(text: Any, concepts: Sequence[tuple[re.Pattern[str], str]],
                      wrong: Sequence[WrongClaim] = (), *, name: str = "explanation",
                      min_chars: int = 15, too_short: str | None = None, subject: str = "解释") -> CheckResult:
    """Score a free-text explanation on what it claims.

    ``concepts`` are the right mechanism's parts, each ``(pattern, message when missing)``;
    each one found earns ``1 / len(concepts)``. A clause that seems to assert a ``wrong`` claim
    (:func:`asserted`: said, not denied) is not taken at its word, since reading prose by pattern can
    be wrong: the result is marked for the instructor's review (``review`` quotes the clause) and the
    learner is asked what the clause means (:meth:`WrongClaim.question`), never told that they claimed it.

    Points of a result marked for review: the concept credit found stays; the shares the claims would
    take back (:data:`WRONG_CLAIM_COST`: two for a wrong mechanism, one for a wrong remedy, never below
    zero) are withheld provisionally (``withheld``), so ``fraction`` is what stands if the instructor
    finds the claims made, and ``fraction + withheld`` what the learner gets if not.
    """
    if not isinstance(text, str) or len(text.strip()) < min_chars:
        return failed(too_short or f"{name} 应该是你自己写的一两句话（至少十几个字）。")
    found = [pattern.search(text) is not None for pattern, _ in concepts]
    missing = [msg for hit, (_, msg) in zip(found, concepts) if not hit]
    hits = sum(found)
    said: list[str] = []
    questions, cost = [], 0
    for claim in wrong:
        clause = asserted(text, claim.pattern, claim.unless)
        if clause is not None and clause not in said:
            said.append(clause)
            cost += WRONG_CLAIM_COST[claim.kind]
            questions.append(claim.question(subject, clause))
    if not said:
        return ratio(hits, len(concepts), missing)
    earned = max(0, hits - cost)
    message = "；".join(missing) + ("。" if missing else "") + "".join(questions)
    return CheckResult(earned / len(concepts), message, review=tuple(said), withheld=(hits - earned) / len(concepts))


def scheduling_messages(ctx: "Context", pod: str) -> list[str]:
    """What the scheduler said about ``pod`` in the run's namespace: its ``FailedScheduling`` events' messages,
    or, where none was captured, the pod's own ``PodScheduled=False`` condition message."""
    found = [e.get("message") or "" for e in ctx.objects("Event", ctx.namespace)
             if dig(e, "involvedObject", "name") == pod and e.get("reason") == "FailedScheduling"]
    if found:
        return found
    obj = ctx.object("Pod", pod, ctx.namespace)
    return [c.get("message") or "" for c in dig(obj, "status", "conditions", default=[]) or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"]


def nodes_with(ctx: "Context", resource: str = "nvidia.com/gpu") -> list[dict[str, Any]]:
    """The captured Nodes whose ``status.capacity`` has ``resource`` > 0 (the GPU nodes, by default)."""
    return [n for n in ctx.objects("Node") if quantity_int(dig(n, "status", "capacity", resource))]


def allocatable_by_node(ctx: "Context", resource: str = "nvidia.com/gpu") -> dict[str, int]:
    """Nodes whose captured ``status.allocatable`` has ``resource`` > 0, with the count."""
    found = {}
    for node in ctx.objects("Node"):
        count = quantity_int(dig(node, "status", "allocatable", resource))
        if count:
            found[node["metadata"]["name"]] = count
    return found


# --------------------------------------------------------------------------- checks and suites


@dataclass(frozen=True)
class Check:
    """A registered check: ``func(ctx) -> CheckResult`` worth ``points``."""

    id: str
    points: float
    func: Callable[[Context], CheckResult]
    title: str = ""
    hidden: bool = False

    def __post_init__(self) -> None:
        if not _CHECK_ID_RE.match(self.id):
            raise ValueError(f"check id {self.id!r} must match {_CHECK_ID_RE.pattern}")
        if not isinstance(self.points, (int, float)) or self.points <= 0:
            raise ValueError(f"check {self.id!r}: points must be > 0, got {self.points!r}")

    def __call__(self, ctx: Context) -> CheckResult:
        return self.func(ctx)


def check(id: str, points: float = 1, *, title: str = "", hidden: bool = False
          ) -> Callable[[Callable[[Context], CheckResult]], Check]:
    """Decorator turning ``func(ctx)`` into a :class:`Check` (collected from its module)."""

    def register(func: Callable[[Context], CheckResult]) -> Check:
        doc_title = (func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else ""
        return Check(id, float(points), func, title or doc_title or id, hidden)

    return register


@dataclass(frozen=True)
class CheckOutcome:
    """One check's result as reported: ``message`` is learner-facing; ``detail``, ``error`` and ``review`` are not.

    ``review`` (the clauses the instructor should read, :attr:`CheckResult.review`) marks an outcome that
    awaits the instructor's review; ``withheld`` is the points withheld until then, not part of ``earned``.
    """

    check_id: str
    label: str
    points: float
    earned: float
    passed: bool
    message: str
    hidden: bool = False
    detail: str = ""
    error: str | None = None
    review: tuple[str, ...] = ()
    withheld: float = 0.0


def _round(x: float) -> float:
    return round(x + 0.0, 2)


def run_check(chk: Check, ctx: Context, label: str | None = None) -> CheckOutcome:
    """Run one check, turning exceptions and bad return values into a zero-point outcome."""
    label = label or chk.title or chk.id
    error = None
    try:
        result = chk(ctx)
        if not isinstance(result, CheckResult):
            raise TypeError(f"check {chk.id!r} returned {type(result).__name__}, expected CheckResult")
    except (MissingValue, MissingObject) as exc:
        result = CheckResult(0.0, exc.message)
    except Exception as exc:  # noqa: BLE001 - a broken check must not abort grading
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        tb = traceback.extract_tb(exc.__traceback__)
        if tb:
            error += f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})"
        result = CheckResult(0.0, "这项检查没能完成：提交里缺少它需要的数据，或数据的格式不对。")
    earned = _round(chk.points * result.fraction)
    if chk.hidden:
        message = HIDDEN_PASSED if result.passed else HIDDEN_PARTIAL if result.fraction > 0 else HIDDEN_FAILED
    else:
        message = result.message
    return CheckOutcome(chk.id, label, chk.points, earned, result.passed, message, chk.hidden,
                        detail=result.message, error=error, review=result.review,
                        withheld=_round(chk.points * result.withheld))


@dataclass(frozen=True)
class CheckSuite:
    """The ordered checks of one lab (visible first, then hidden)."""

    lab: str
    checks: tuple[Check, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for chk in self.checks:
            if chk.id in seen:
                raise CheckLoadError(f"lab {self.lab!r}: duplicate check id {chk.id!r}")
            seen.add(chk.id)

    @property
    def max_points(self) -> float:
        return _round(sum(c.points for c in self.checks))

    def with_hidden(self, hidden: Iterable[Check]) -> CheckSuite:
        extra = tuple(dataclasses.replace(c, hidden=True) for c in hidden)
        return CheckSuite(self.lab, self.checks + extra)

    def labels(self) -> dict[str, str]:
        """Learner-facing names; hidden checks are numbered, never named."""
        names, n = {}, 0
        for chk in self.checks:
            if chk.hidden:
                n += 1
                names[chk.id] = f"隐藏检查 {n}"
            else:
                names[chk.id] = chk.title or chk.id
        return names

    def run(self, ctx: Context) -> list[CheckOutcome]:
        labels = self.labels()
        return [run_check(chk, ctx, labels[chk.id]) for chk in self.checks]


# --------------------------------------------------------------------------- loading


def collect_checks(module: ModuleType) -> list[Check]:
    """The :class:`Check` objects defined in ``module``, in definition order."""
    return [obj for obj in vars(module).values() if isinstance(obj, Check)]


def _lab_key(lab: str) -> str:
    match = re.match(r"^(?:lab[_-]?)?(\d+)", lab)
    return str(int(match.group(1))) if match else lab.strip().lower().replace("_", "-")


def lab_module_name(lab: str) -> str:
    """``"03"``, ``"03-scheduling"`` or ``"lab_03"`` → ``gpulab.grading.labs.lab_03``."""
    match = re.match(r"^(?:lab[_-]?)?(\d+)", lab)
    if match:
        return f"gpulab.grading.labs.lab_{int(match.group(1)):02d}"
    return f"gpulab.grading.labs.{re.sub(r'[^a-z0-9_]', '_', lab.lower())}"


def _import_file(path: Path, prefix: str) -> ModuleType:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CheckLoadError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - report which file is broken
        raise CheckLoadError(f"{path}: failed to import: {type(exc).__name__}: {exc}") from exc
    return module


def load_lab_checks(lab: str | Path) -> CheckSuite:
    """The suite for ``lab``: a lab id resolved by :func:`lab_module_name`, or a ``.py`` path."""
    path = Path(lab)
    if path.suffix == ".py":
        if not path.is_file():
            raise CheckLoadError(f"{path}: no such check module")
        module = _import_file(path, "gpulab_lab")
    else:
        name = lab_module_name(str(lab))
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            raise CheckLoadError(f"no check module {name} for lab {lab!r}") from exc
    checks = collect_checks(module)
    if not checks:
        raise CheckLoadError(f"{module.__name__}: defines no checks")
    lab_id = getattr(module, "LAB", None) or (path.stem if path.suffix == ".py" else str(lab))
    return CheckSuite(str(lab_id), tuple(checks))


def load_hidden_checks(directory: str | Path, lab: str | None = None) -> tuple[Check, ...]:
    """All checks in ``directory/*.py`` (sorted by file name), marked hidden.

    A file may declare ``LAB = "03-scheduling"``; when ``lab`` is given, files
    for other labs are skipped, so one directory can hold every lab's hidden
    checks. Import errors are raised (the instructor must fix them before
    grading), never reported to learners.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckLoadError(f"{directory}: hidden-check directory does not exist")
    found: list[Check] = []
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        module = _import_file(path, "gpulab_hidden")
        declared = getattr(module, "LAB", None)
        if lab is not None and declared is not None and _lab_key(str(declared)) != _lab_key(lab):
            continue
        found.extend(dataclasses.replace(c, hidden=True) for c in collect_checks(module))
    return tuple(found)
