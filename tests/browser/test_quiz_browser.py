"""One quiz, answered in a real browser: JupyterLab in headless Chromium, clicks, feedback, screenshots.

The test starts its own JupyterLab on 127.0.0.1 (a free port, a random
token, settings, workspaces and runtime files under ``tmp_path``, quiz
progress in a ``GPULAB_HOME`` of its own) and opens a one-cell notebook that
calls ``show_quiz("04")``. The cell carries a saved output, as a notebook
handed out with outputs does; the notebook is not trusted, so before the cell
runs JupyterLab must show the quiz's static HTML fallback, not a ``VBox(…)``
repr. Then it runs the cell and works the quiz the way a learner does:

- the first single-choice question: a wrong option and 提交 (× with a hint,
  no explanation, a 显示答案 button), then the right one (✓ with the explanation);
- the question with the section's longest option (sh-ts-facts, option E, that
  used to be cut off mid-word): every option's text is fully visible — wrapped
  onto several lines inside its row, not clipped, not covered, no ellipsis;
  then a wrong answer and 显示答案 (the key and the explanation).

Screenshots go to ``tmp_path``; their paths are in every assertion message.
JupyterLab is always stopped, whatever happens.

No cluster is needed: the quiz widgets only need a kernel.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import nbformat
import pytest

from gpulab.quiz import MultipleChoice, ProgressStore, SingleChoice, build_quiz, hint_for, load_section

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SECTION = "04"
START_TIMEOUT = 120  # JupyterLab and a kernel on a busy 2-core machine
UI_TIMEOUT_MS = 120_000
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"]


def accept_kernel_picker(page) -> None:
    """Accept JupyterLab's kernel picker (its "选择内核" dialog) whenever it shows, with the kernel it preselects.

    On a busy machine JupyterLab may ask which kernel to use although the notebook names one; a learner then
    clicks 选择 (Select), and the test does the same instead of finding every click under the dialog refused.
    """
    picker = page.locator(".jp-Dialog").filter(has_text=re.compile("选择内核|Select Kernel"))
    page.add_locator_handler(picker, lambda dialog: dialog.locator(".jp-mod-accept").click())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path: Path, work: Path) -> None:
    """The quiz cell, with the output ``show_quiz`` left in it last time (widget model long gone)."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f'from gpulab.quiz import show_quiz\nshow_quiz("{SECTION}")')
    bundle = build_quiz(SECTION, ProgressStore(work / "build-progress.json")).mimebundle()
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


# For one option label: is all of its text on screen? Each line box of the text must lie inside the label,
# inside every ancestor that clips (overflow other than visible), and be what is hit at its own centre (not
# covered by the next row or the buttons). Returns the problems found, and the number of lines.
TEXT_FULLY_VISIBLE_JS = """(label) => {
  const problems = [];
  const style = getComputedStyle(label);
  if (style.textOverflow === 'ellipsis' && style.whiteSpace === 'nowrap') problems.push('nowrap + ellipsis');
  if (label.scrollWidth > label.clientWidth + 1) {
    problems.push(`overflows sideways ${label.scrollWidth}>${label.clientWidth}`);
  }
  const walker = document.createTreeWalker(label, NodeFilter.SHOW_TEXT);
  const rects = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) if (r.width > 0 && r.height > 0) rects.push({rect: r, node});
  }
  if (!rects.length) problems.push('no text rendered');
  for (let el = label; el && el !== document.body; el = el.parentElement) {
    const cs = getComputedStyle(el);
    const clips = cs.overflowX !== 'visible' || cs.overflowY !== 'visible';
    if (el !== label && !clips) continue;
    const box = el.getBoundingClientRect();
    for (const {rect} of rects) {
      if (rect.top < box.top - 1 || rect.bottom > box.bottom + 1
          || rect.left < box.left - 1 || rect.right > box.right + 1) {
        problems.push(`line at y=${Math.round(rect.top)} outside ${el.tagName}.${el.className} `
                      + `(${Math.round(box.top)}..${Math.round(box.bottom)})`);
      }
    }
  }
  for (const {rect, node} of rects) {
    const hit = document.elementFromPoint(rect.left + rect.width / 2, rect.top + rect.height / 2);
    if (!hit || !(hit === node.parentElement || node.parentElement.contains(hit) || hit.contains(node))) {
      const what = hit ? hit.tagName + '.' + hit.className : 'nothing';
      problems.push(`line at y=${Math.round(rect.top)} covered by ${what}`);
    }
  }
  const lines = new Set(rects.map(({rect}) => Math.round(rect.top))).size;
  return {problems, lines, text: label.innerText};
}"""


def quiet_settings(settings: Path) -> None:
    """No news or update checks (no internet here), so no toast covers the notebook."""
    folder = settings / "@jupyterlab" / "apputils-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                          "checkForUpdates": False}))


class JupyterLab:
    """A JupyterLab server of the test's own; :meth:`stop` always ends it (and its kernels).

    ``command`` starts JupyterLab with this interpreter (``-m gpulab.cli jupyter``: as ``make lab`` does), ``args``
    and ``env`` go on top of the test's own; terminals are off unless ``terminals``.
    """

    def __init__(self, root: Path, work: Path, command: Sequence[str] = ("-m", "jupyter", "lab"),
                 args: Sequence[str] = (), env: dict[str, str] | None = None, terminals: bool = False):
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.log_path = work / "jupyterlab.log"
        env = {**os.environ,
               "GPULAB_HOME": str(work / "gpulab-home"),
               "JUPYTERLAB_SETTINGS_DIR": str(work / "lab-settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(work / "lab-workspaces"),
               "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
               "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        quiet_settings(work / "lab-settings")
        cmd = [sys.executable, *command, "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
               "--LabApp.news_url=", *([] if terminals else ["--ServerApp.terminals_enabled=False"]), *args]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"JupyterLab did not answer on {self.base} within {timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its kernels
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self._log.close()


def run_first_cell(page) -> None:
    """Run the notebook's one cell as a learner would: click into it, Shift+Enter.

    A key press that lands before the notebook panel takes focus (a busy
    machine) is lost; then the prompt stays ``[ ]:`` and the press is repeated.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    cell = page.locator(".jp-Notebook .jp-Cell").first
    editor = cell.locator(".jp-InputArea-editor")
    editor.wait_for(state="visible")
    for attempt in range(4):
        editor.click()
        page.keyboard.press("Shift+Enter")
        try:  # queued ([*]) or done ([1]): the run was accepted
            expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=20_000)
            return
        except (AssertionError, PlaywrightTimeout):
            if attempt == 3:
                raise


def test_a_quiz_answered_in_jupyterlab_in_headless_chromium(tmp_path, chromium_path, sync_playwright):
    from playwright.sync_api import expect

    bank = load_section(SECTION)
    question = next(q for q in bank.questions if isinstance(q, SingleChoice))
    ids = [o.id for o in question.options]
    right = ids.index(question.answer)
    wrong = next(i for i in range(len(ids)) if i != right)
    # The multiple-choice question with the section's longest option (in 04: sh-ts-facts, option E).
    long_q = max((q for q in bank.questions if isinstance(q, MultipleChoice)),
                 key=lambda q: max(len(o.text) for o in q.options))
    long_opt = max(long_q.options, key=lambda o: len(o.text))
    long_wrong = next(o.id for o in long_q.options if o.id not in long_q.answer)
    hint = re.sub(r"[`*]", "", hint_for(question))

    root = tmp_path / "lab"
    root.mkdir()
    write_notebook(root / "quiz.ipynb", tmp_path)
    shots = {name: tmp_path / f"quiz-{name}.png" for name in ("static", "wrong", "right", "long", "revealed",
                                                               "failure")}
    lab = JupyterLab(root, tmp_path)
    page = None
    try:
        lab.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1400}, locale="zh-CN")
                accept_kernel_picker(page)
                page.set_default_timeout(UI_TIMEOUT_MS)
                page.goto(f"{lab.base}/lab/tree/quiz.ipynb?token={lab.token}")

                # Before the cell runs: the saved output shows the questions (static HTML), not a widget repr.
                output = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-OutputArea-output")
                expect(output).to_contain_text("这是静态预览", timeout=UI_TIMEOUT_MS)
                page.screenshot(path=str(shots["static"]))
                static = output.inner_text()
                assert "VBox(" not in static and bank.title in static, \
                    f"saved output before the run: {static[:300]!r}; screenshot: {shots['static']}"
                assert question.prompt.strip().splitlines()[0].split("`")[0] in static, \
                    f"question missing from the static output; screenshot: {shots['static']}"
                assert "解析：" not in static and question.explanation[:15] not in static, \
                    f"static output shows explanations; screenshot: {shots['static']}"

                run_first_cell(page)

                card = page.locator(f".gpulab-quiz-{question.id}")
                card.wait_for(state="visible")
                radios = card.locator(".gpulab-quiz-input input[type='radio']")
                assert radios.count() == len(ids), f"{radios.count()} radio buttons for options {ids}"
                for n, option in enumerate(question.options):  # radio options are shown whole too
                    result = card.locator(".widget-radio-box label").nth(n).evaluate(TEXT_FULLY_VISIBLE_JS)
                    assert not result["problems"] and option.text.replace("`", "") in result["text"], \
                        f"radio option {option.id.upper()}: {result}"
                feedback = card.locator(".gpulab-quiz-feedback")
                submit = card.locator("button.gpulab-quiz-submit")
                reveal = card.locator("button.gpulab-quiz-reveal")
                expect(reveal).to_be_hidden()

                def answer(option: int, verdict: str, shot: Path) -> str:
                    """Pick an option, submit, and return the feedback once it shows ``verdict``."""
                    radios.nth(option).click()
                    submit.click()
                    card.locator(f".gpulab-quiz-feedback.gpulab-quiz-{verdict}").wait_for(state="visible")
                    card.scroll_into_view_if_needed()
                    page.screenshot(path=str(shot))
                    return feedback.inner_text()

                text = answer(wrong, "wrong", shots["wrong"])
                assert "×" in text and "回答错误" in text and "提示" in text and hint in text, \
                    f"feedback after a wrong answer: {text!r}; screenshot: {shots['wrong']}"
                assert "解析" not in text and question.explanation[:15] not in text, \
                    f"a wrong answer gave the explanation away: {text!r}; screenshot: {shots['wrong']}"
                assert not re.search("[\u2705\u274c\u26a0\ufe0f]", text), f"emoji in {text!r}"
                expect(reveal).to_be_visible()

                # Another try: the right option.
                text = answer(right, "correct", shots["right"])
                assert "✓" in text and "回答正确" in text and "解析" in text, \
                    f"feedback after the right answer: {text!r}; screenshot: {shots['right']}"
                assert "提示" not in text, f"hint still shown after the right answer: {text!r}"
                expect(reveal).to_be_hidden()
                summary = page.locator(".gpulab-quiz-summary").inner_text()
                assert f"已答 1 / {len(bank.questions)} 题，答对 1 题" in summary, \
                    f"progress line {summary!r}; screenshot: {shots['right']}"

                # Long options: every option of the question is fully on screen, the longest on several lines.
                long_card = page.locator(f".gpulab-quiz-{long_q.id}")
                long_card.scroll_into_view_if_needed()
                long_card.screenshot(path=str(shots["long"]))
                for option in long_q.options:
                    label = long_card.locator(f".gpulab-quiz-option-{option.id} label.widget-label-basic")
                    result = label.evaluate(TEXT_FULLY_VISIBLE_JS)
                    assert not result["problems"], \
                        f"option {option.id.upper()} not fully visible: {result}; screenshot: {shots['long']}"
                    assert result["text"].strip() == f"{option.id.upper()}. {option.text.replace('`', '')}", \
                        f"option {option.id.upper()} text {result['text']!r}; screenshot: {shots['long']}"
                    if option is long_opt:
                        assert result["lines"] >= 2, \
                            f"option {option.id.upper()} did not wrap: {result}; screenshot: {shots['long']}"

                # A wrong answer there, then 显示答案: the key and the explanation.
                long_card.locator(f".gpulab-quiz-option-{long_wrong} input[type='checkbox']").click()
                long_card.locator("button.gpulab-quiz-submit").click()
                long_card.locator(".gpulab-quiz-feedback.gpulab-quiz-wrong").wait_for(state="visible")
                long_card.locator("button.gpulab-quiz-reveal").click()
                long_card.locator(".gpulab-quiz-feedback.gpulab-quiz-revealed").wait_for(state="visible")
                long_card.scroll_into_view_if_needed()
                page.screenshot(path=str(shots["revealed"]))
                text = long_card.locator(".gpulab-quiz-feedback").inner_text()
                assert "正确答案" in text and "解析" in text, \
                    f"feedback after 显示答案: {text!r}; screenshot: {shots['revealed']}"
                expect(long_card.locator("button.gpulab-quiz-reveal")).to_be_hidden()
            except Exception as exc:
                if page is not None:
                    try:
                        page.screenshot(path=str(shots["failure"]), full_page=True)
                    except Exception:  # noqa: BLE001 - the original error matters more
                        pass
                raise AssertionError(f"{type(exc).__name__}: {exc}\nscreenshot: {shots['failure']}\n"
                                     f"JupyterLab log ({lab.log_path}):\n{lab.log_tail()}") from exc
            finally:
                browser.close()
    finally:
        lab.stop()

    for name in ("static", "wrong", "right", "long", "revealed"):
        assert shots[name].is_file() and shots[name].stat().st_size > 5_000, \
            f"screenshot {shots[name]} missing or empty"
    # The clicks went through the kernel: answers, the retry and the shown key are in the learner's progress.
    saved = json.loads((tmp_path / "gpulab-home" / "progress.json").read_text())["sections"][bank.section]
    assert saved[question.id]["correct"] is True and saved[question.id]["attempts"] == 2, \
        f"progress for {question.id}: {saved.get(question.id)}; screenshot: {shots['right']}"
    assert saved[long_q.id]["revealed"] is True and saved[long_q.id]["answer"] == [long_wrong], \
        f"progress for {long_q.id}: {saved.get(long_q.id)}; screenshot: {shots['revealed']}"
    print("screenshots: " + " ".join(str(shots[n]) for n in ("static", "wrong", "right", "long", "revealed")))
