"""A learner's first hour from JupyterLab alone, in headless Chromium: JupyterLab as ``make lab`` starts it.

Both tests start JupyterLab the way ``make lab`` does, through ``gpulab jupyter`` (the server of
``test_quiz_browser.py``: 127.0.0.1, a random token, settings and runtime files of the test's own, always
stopped), from an environment whose ``PATH`` lacks this interpreter's ``bin`` and whose ``KUBECONFIG`` is some
other cluster's, as a learner's shell may be. JupyterLab's application settings directory is a stand-in
environment's, into which the Makefile's own rule installed the course's settings override (as ``make install``
does into ``.venv``). ``PYTHONPATH`` is this checkout, so the server, its kernels and its terminals run the
gpulab under test even where ``.venv``'s editable install points at another checkout.

- :func:`test_jupyterlab_is_chinese_and_its_terminal_has_gpulab_kubectl_and_the_kubeconfig` needs no cluster.
  The menus are Chinese (the zh-CN language pack's words: 文件, 编辑, 查看 ...). A terminal opened in it (终端 1)
  runs ``gpulab --help``, ``kubectl version --client`` (1.37, this environment's, not another on PATH) and
  ``echo $KUBECONFIG`` (the cluster's kubeconfig, under ``GPULAB_HOME``); the test reads each output from the
  page (xterm's screen-reader rows: the terminal draws on a canvas). A notebook's ``sh("kubectl get nodes")``
  on a cluster never started shows kubectl's "connection … refused" followed by gpulab's note of what to run.
- :func:`test_a_lessons_first_cell_on_a_stopped_cluster_starts_it` starts a real embedded cluster (binaries
  from the build cache: ``make build``, which ``make test`` runs, builds them) in a fresh ``GPULAB_HOME`` and
  always removes it (``gpulab down --purge``). In a copy of lesson 00, unmodified, the first code cell
  (``setup("00-orientation")``) finds no cluster, says so in Chinese and starts it, with bring-up's progress lines
  in Chinese, until 集群就绪. Then the cluster is stopped behind the notebook's back (``gpulab down``) and the
  lesson's ``sh("kubectl version")`` cell shows kubectl's refusal followed by gpulab's note.
- Lesson 00 as handed out opens unmodified once its kernel connected (the first test).

Screenshots go to ``tmp_path``; their paths are in every assertion message.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

# The JupyterLab server and Chromium flags of the quiz's browser test: one way to run them.
from test_quiz_browser import CHROMIUM_ARGS, UI_TIMEOUT_MS, JupyterLab, accept_kernel_picker

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # gpulab and kubectl 1.37 of this environment
# The zh-CN language pack's words for JupyterLab's main menus (File, Edit, View, Run, Kernel, Settings, Help).
CHINESE_MENUS = ("文件", "编辑", "查看", "运行", "内核", "设置", "帮助")
ENGLISH_MENUS = ("File", "Edit", "View", "Run", "Kernel", "Settings", "Help")
LESSON = REPO / "notebooks" / "00-orientation.ipynb"
REFUSED = "was refused"  # kubectl's own words
NOTE = "⚠ gpulab：kubectl 连不上集群，因为集群没有在运行"  # gpulab's, after them
CLUSTER_START_S = 480  # a first bring-up on a busy 2-core machine, image builds not included
VIEWPORT = {"width": 1280, "height": 1000}


def start_lab(root: Path, work: Path, gpulab_home: Path) -> JupyterLab:
    """JupyterLab through `gpulab jupyter`, with the settings override make install's rule installs."""
    env_prefix = work / "env"  # stands in for .venv: the Makefile's rule installs the override into it
    override = env_prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.d" / "gpulab.json"
    made = subprocess.run(["make", "-s", "-C", str(REPO), f"VENV={env_prefix}", str(override)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and override.is_file(), made.stdout + made.stderr
    # The terminal's text in the page: xterm draws on a canvas, and mirrors its rows for screen readers.
    # Every cell of a notebook in the page, so the nth cell element is the notebook's nth cell.
    for plugin, settings in (("terminal-extension/plugin", {"screenReaderMode": True}),
                             ("notebook-extension/tracker", {"windowingMode": "none"})):
        path = work / "lab-settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    learner_path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != BIN]
    env = {"GPULAB_HOME": str(gpulab_home), "PATH": os.pathsep.join(learner_path),
           "KUBECONFIG": str(work / "some-other-cluster.kubeconfig"), "SHELL": "/bin/bash",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return JupyterLab(root, work, command=("-m", "gpulab.cli", "jupyter"), env=env, terminals=True,
                      args=(f"--LabApp.app_settings_dir={override.parent.parent}",
                            # the page's `window.jupyterapp`: cells are run by JupyterLab's own commands
                            "--LabApp.expose_app_in_browser=True"))


def assert_chinese_ui(page, shot: Path) -> None:
    from playwright.sync_api import expect

    labels = page.locator("#jp-menu-panel .lm-MenuBar-itemLabel")
    expect(labels.first).to_have_text(CHINESE_MENUS[0], timeout=UI_TIMEOUT_MS)
    shown = [label.strip() for label in labels.all_inner_texts()]
    page.screenshot(path=str(shot))
    assert set(CHINESE_MENUS) <= set(shown) and not set(ENGLISH_MENUS) & set(shown), \
        f"menus {shown}; screenshot: {shot}"


def run_cell(page, index: int) -> None:
    """Run the open notebook's cell ``index`` with JupyterLab's own command (what Shift+Enter runs), once its kernel
    is ready; returns at once (the output is waited for by the caller). Its saved output goes first, so that what
    the caller waits for is this run's."""
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index).wait_for()
    page.evaluate("""async (index) => {
      const panel = window.jupyterapp.shell.currentWidget;
      if (!panel || !panel.sessionContext) throw new Error('the current widget is not a notebook: ' + panel?.id);
      await panel.context.ready;
      await panel.sessionContext.ready;
      panel.content.activeCellIndex = index;
      await window.jupyterapp.commands.execute('notebook:clear-cell-output');
      void window.jupyterapp.commands.execute('notebook:run-cell');
    }""", index)


def cell_output(page, index: int):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index).locator(
        ".jp-OutputArea")


class Terminal:
    """The JupyterLab terminal on the page: type a command line, read what the screen shows."""

    def __init__(self, page):
        self.page = page
        self.rows = page.locator(".jp-Terminal .xterm-accessibility-tree")

    def screen(self) -> str:
        """The visible rows as one string: a line the terminal wrapped reads whole (rows are joined as they are)."""
        return self.rows.text_content() or ""

    def run(self, line: str, done: str, shot: Path) -> str:
        """Clear the screen, run ``line``, wait until the screen shows ``done`` (which the typed line itself must
        not contain), return the screen."""
        from playwright.sync_api import expect

        assert done not in line
        self.page.locator(".jp-Terminal").click()
        self.page.keyboard.type(f"clear; {line}")
        self.page.keyboard.press("Enter")
        try:
            expect(self.rows).to_contain_text(done, timeout=UI_TIMEOUT_MS)
        finally:
            self.page.screenshot(path=str(shot))
        return self.screen()


def fail_with_context(exc: Exception, page, shot: Path, lab: JupyterLab) -> AssertionError:
    if page is not None:
        try:
            page.screenshot(path=str(shot), full_page=True)
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
    return AssertionError(f"{type(exc).__name__}: {exc}\nscreenshot: {shot}\n"
                          f"JupyterLab log ({lab.log_path}):\n{lab.log_tail()}")


def test_jupyterlab_is_chinese_and_its_terminal_has_gpulab_kubectl_and_the_kubeconfig(tmp_path, chromium_path,
                                                                                        sync_playwright):
    from playwright.sync_api import expect

    root = tmp_path / "lab"
    root.mkdir()
    cell = nbformat.v4.new_code_cell('from gpulab.notebook import sh\nsh("kubectl get nodes", check=False)')
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a saved output, from another day\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "stopped.ipynb")
    shutil.copy2(LESSON, root / LESSON.name)  # as handed out: outputs and metadata
    gpulab_home = tmp_path / "gpulab-home"  # no cluster was ever started here
    kubeconfig = gpulab_home / "cluster" / "kubeconfig"
    shots = {name: tmp_path / f"first-hour-{name}.png"
             for name in ("menus", "help", "kubectl", "kubeconfig", "notebook", "opened", "failure")}
    lab = start_lab(root, tmp_path, gpulab_home)
    page = None
    try:
        lab.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport=VIEWPORT, locale="zh-CN")
                accept_kernel_picker(page)
                page.set_default_timeout(UI_TIMEOUT_MS)
                page.goto(f"{lab.base}/lab?token={lab.token}")
                assert_chinese_ui(page, shots["menus"])

                page.evaluate("() => void window.jupyterapp.commands.execute('terminal:create-new')")
                expect(page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")).to_have_text(
                    "终端 1")
                terminal = Terminal(page)
                expect(terminal.rows).to_contain_text(str(root.name))  # the prompt, in the server's root

                screen = terminal.run("gpulab --help; echo HELP-$((40+2))", "HELP-42", shots["help"])
                assert "Usage: gpulab [OPTIONS] COMMAND [ARGS]..." in screen and "kubeconfig" in screen, \
                    f"gpulab --help in the terminal: {screen!r}; screenshot: {shots['help']}"

                screen = terminal.run('kubectl version --client; echo "KUBECTL=[$(command -v kubectl)]"',
                                      f"KUBECTL=[{BIN}", shots["kubectl"])
                assert "Client Version: v1.37." in screen and f"KUBECTL=[{BIN}/kubectl]" in screen, \
                    f"kubectl in the terminal: {screen!r}; screenshot: {shots['kubectl']}"

                screen = terminal.run('echo "KUBECONFIG=[$KUBECONFIG] GPULAB=[$(command -v gpulab)]"',
                                      "KUBECONFIG=[/", shots["kubeconfig"])
                assert f"KUBECONFIG=[{kubeconfig}]" in screen and f"GPULAB=[{BIN}/gpulab]" in screen, \
                    f"the terminal's KUBECONFIG and gpulab: {screen!r}; screenshot: {shots['kubeconfig']}"

                # A notebook's kubectl on a cluster that was never started: kubectl's words, then gpulab's.
                page.goto(f"{lab.base}/lab/tree/stopped.ipynb?token={lab.token}")
                run_cell(page, 0)
                output = cell_output(page, 0)
                expect(output).to_contain_text(NOTE, timeout=UI_TIMEOUT_MS)
                page.screenshot(path=str(shots["notebook"]))
                text = output.inner_text()
                assert REFUSED in text and text.index(REFUSED) < text.index(NOTE) and "`gpulab up`" in text, \
                    f"sh('kubectl get nodes') on a stopped cluster: {text!r}; screenshot: {shots['notebook']}"
                assert "from another day" not in text, f"the saved output stayed: {text!r}"

                # A lesson as handed out opens unmodified: its stored kernelspec and language are the ones the
                # kernel reports (JupyterLab writes them into the notebook when the kernel connects). Where it is
                # not, what differs from the file on disk is in the message.
                opened = page.evaluate("""async (path) => {
                  const panel = await window.jupyterapp.commands.execute('docmanager:open', {path});
                  await panel.context.ready;
                  await panel.sessionContext.ready;
                  await panel.sessionContext.session.kernel.info;
                  await new Promise(resolve => setTimeout(resolve, 2000));  // JupyterLab's metadata updates
                  const token = new URLSearchParams(window.location.search).get('token');
                  const disk = (await (await fetch(`/api/contents/${path}?content=1&token=${token}`)).json()).content;
                  const diffs = [];
                  const compare = (a, b, where) => {
                    if (diffs.length >= 10 || JSON.stringify(a) === JSON.stringify(b)) return;
                    if (a && b && typeof a === 'object' && typeof b === 'object') {
                      for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) compare(a[k], b[k], `${where}.${k}`);
                    } else diffs.push(`${where}: ${JSON.stringify(a)} on disk, ${JSON.stringify(b)} open`);
                  };
                  compare(disk.metadata, panel.context.model.toJSON().metadata, 'metadata');
                  return {dirty: panel.context.model.dirty, diffs};
                }""", LESSON.name)
                page.screenshot(path=str(shots["opened"]))
                assert opened["dirty"] is False, (f"{LESSON.name} opened marked modified: {opened['diffs']}; "
                                                  f"screenshot: {shots['opened']}")
            except Exception as exc:
                raise fail_with_context(exc, page, shots["failure"], lab) from exc
            finally:
                browser.close()
    finally:
        lab.stop()
    print("screenshots: " + " ".join(str(shots[n]) for n in ("menus", "help", "kubectl", "kubeconfig", "notebook")))


def _gpulab(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPULAB_HOME=str(home),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-m", "gpulab.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.timeout(CLUSTER_START_S + 420)
def test_a_lessons_first_cell_on_a_stopped_cluster_starts_it(tmp_path, chromium_path, sync_playwright):
    from playwright.sync_api import expect

    lesson = REPO / "notebooks" / "00-orientation.ipynb"
    cells = nbformat.read(lesson, as_version=4).cells
    first = next(i for i, c in enumerate(cells) if c.cell_type == "code")
    assert 'setup("00-orientation")' in cells[first].source
    version = next(i for i, c in enumerate(cells) if c.cell_type == "code" and 'sh("kubectl version")' in c.source)
    root = tmp_path / "lab"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy2(lesson, root / "notebooks" / lesson.name)  # as handed out: outputs and all
    # Short, and searchable by nobody (pods run as nobody): unix sockets under it stay under 108 bytes.
    gpulab_home = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))
    gpulab_home.chmod(0o755)
    shots = {name: tmp_path / f"first-hour-{name}.png" for name in ("started", "stopped", "failure")}
    lab = start_lab(root, tmp_path, gpulab_home)
    page = None
    try:
        lab.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport=VIEWPORT, locale="zh-CN")
                accept_kernel_picker(page)
                page.set_default_timeout(UI_TIMEOUT_MS)
                page.goto(f"{lab.base}/lab/tree/notebooks/{lesson.name}?token={lab.token}")
                assert_chinese_ui(page, tmp_path / "first-hour-lesson-menus.png")

                run_cell(page, first)
                output = cell_output(page, first)
                expect(output).to_contain_text("集群没有在运行，现在启动它", timeout=UI_TIMEOUT_MS)
                expect(output).to_contain_text("✓ 集群就绪", timeout=CLUSTER_START_S * 1000)
                output.scroll_into_view_if_needed()
                page.screenshot(path=str(shots["started"]))
                text = output.inner_text()
                assert "集群没有在运行，现在启动它" in text, \
                    f"setup() on a stopped cluster: {text!r}; screenshot: {shots['started']}"
                # Bring-up's own progress lines, in Chinese (gpulab's zh_CN catalog: "启动 {components}").
                assert "\n  启动 etcd" in text and "集群已启动" in text and "Traceback" not in text, \
                    f"setup()'s progress lines: {text!r}; screenshot: {shots['started']}"

                # Stopped behind the lesson's back: its kubectl cell says what to run after kubectl's own words.
                down = _gpulab(gpulab_home, "down")
                assert down.returncode == 0, down.stdout + down.stderr
                run_cell(page, version)
                output = cell_output(page, version)
                expect(output).to_contain_text(NOTE, timeout=UI_TIMEOUT_MS)
                output.scroll_into_view_if_needed()
                page.screenshot(path=str(shots["stopped"]))
                text = output.inner_text()
                assert REFUSED in text and text.index(REFUSED) < text.index(NOTE) and "`gpulab up`" in text, \
                    f"sh('kubectl version') on a stopped cluster: {text!r}; screenshot: {shots['stopped']}"
            except Exception as exc:
                raise fail_with_context(exc, page, shots["failure"], lab) from exc
            finally:
                browser.close()
    finally:
        try:
            lab.stop()
        finally:
            purged = _gpulab(gpulab_home, "down", "--purge")
            shutil.rmtree(gpulab_home, ignore_errors=True)
        assert purged.returncode == 0, f"gpulab down --purge: {purged.stdout}{purged.stderr}"
    print("screenshots: " + " ".join(str(shots[n]) for n in ("started", "stopped")))
