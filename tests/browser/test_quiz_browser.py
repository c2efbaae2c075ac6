"""One quiz, answered in a real browser: JupyterLab in headless Chromium, clicks, feedback, a screenshot.

The test starts its own JupyterLab on 127.0.0.1 (a free port, a random
token, settings, workspaces and runtime files under ``tmp_path``, quiz
progress in a ``GPULAB_HOME`` of its own), opens a one-cell notebook that
calls ``show_quiz("08")``, runs the cell, and answers the section's first
single-choice question the way a learner does: a click on a wrong option and
提交 (❌ with the explanation), then a click on the right one and 提交 (✅).
Screenshots of both go to ``tmp_path``; their paths are in every assertion
message. JupyterLab is always stopped, whatever happens.

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
from pathlib import Path

import nbformat
import pytest

from gpulab.quiz import SingleChoice, load_section

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
SECTION = "08"
START_TIMEOUT = 120  # JupyterLab and a kernel on a busy 2-core machine
UI_TIMEOUT_MS = 120_000
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f'from gpulab.quiz import show_quiz\nshow_quiz("{SECTION}")')]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def quiet_settings(settings: Path) -> None:
    """No news or update checks (no internet here), so no toast covers the notebook."""
    folder = settings / "@jupyterlab" / "apputils-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                          "checkForUpdates": False}))


class JupyterLab:
    """A JupyterLab server of the test's own; :meth:`stop` always ends it (and its kernels)."""

    def __init__(self, root: Path, work: Path):
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.log_path = work / "jupyterlab.log"
        env = dict(os.environ,
                   GPULAB_HOME=str(work / "gpulab-home"),
                   JUPYTERLAB_SETTINGS_DIR=str(work / "lab-settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(work / "lab-workspaces"),
                   JUPYTER_RUNTIME_DIR=str(work / "runtime"),
                   PYTHONDONTWRITEBYTECODE="1")
        quiet_settings(work / "lab-settings")
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
               "--LabApp.news_url=", "--ServerApp.terminals_enabled=False"]
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
    bank = load_section(SECTION)
    question = next(q for q in bank.questions if isinstance(q, SingleChoice))
    ids = [o.id for o in question.options]
    right = ids.index(question.answer)
    wrong = next(i for i in range(len(ids)) if i != right)

    root = tmp_path / "lab"
    root.mkdir()
    write_notebook(root / "quiz.ipynb")
    shots = {"wrong": tmp_path / "quiz-wrong.png", "right": tmp_path / "quiz-right.png",
             "failure": tmp_path / "quiz-failure.png"}
    lab = JupyterLab(root, tmp_path)
    page = None
    try:
        lab.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1400}, locale="zh-CN")
                page.set_default_timeout(UI_TIMEOUT_MS)
                page.goto(f"{lab.base}/lab/tree/quiz.ipynb?token={lab.token}")
                run_first_cell(page)

                card = page.locator(f".gpulab-quiz-{question.id}")
                card.wait_for(state="visible")
                radios = card.locator(".gpulab-quiz-input input[type='radio']")
                assert radios.count() == len(ids), f"{radios.count()} radio buttons for options {ids}"
                feedback = card.locator(".gpulab-quiz-feedback")
                submit = card.locator("button.gpulab-quiz-submit")

                def answer(option: int, verdict: str, shot: Path) -> str:
                    """Pick an option, submit, and return the feedback once it shows ``verdict``."""
                    radios.nth(option).click()
                    submit.click()
                    card.locator(f".gpulab-quiz-feedback.gpulab-quiz-{verdict}").wait_for(state="visible")
                    card.scroll_into_view_if_needed()
                    page.screenshot(path=str(shot))
                    return feedback.inner_text()

                text = answer(wrong, "wrong", shots["wrong"])
                assert "❌" in text and "回答错误" in text and "解析" in text, \
                    f"feedback after a wrong answer: {text!r}; screenshot: {shots['wrong']}"

                text = answer(right, "correct", shots["right"])
                assert "✅" in text and "回答正确" in text, \
                    f"feedback after the right answer: {text!r}; screenshot: {shots['right']}"
                summary = page.locator(".gpulab-quiz-summary").inner_text()
                assert f"已答 1 / {len(bank.questions)} 题，答对 1 题" in summary, \
                    f"progress line {summary!r}; screenshot: {shots['right']}"
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

    for name in ("wrong", "right"):
        assert shots[name].is_file() and shots[name].stat().st_size > 10_000, \
            f"screenshot {shots[name]} missing or empty"
    # The click went through the kernel: the answer is in the learner's progress.
    saved = json.loads((tmp_path / "gpulab-home" / "progress.json").read_text())
    assert question.id in json.dumps(saved, ensure_ascii=False), \
        f"answer to {question.id} not saved in progress.json: {saved}; screenshot: {shots['right']}"
    print(f"screenshots: {shots['wrong']} {shots['right']}")
