"""The CLI's messages in the user's language (gpulab/i18n.py): the catalog, the choice of language, the CLI in both.

The catalog test is the one `tools/messages.py --check` runs: every message marked
in gpulab/ is in gpulab/locale/zh_CN/LC_MESSAGES/gpulab.po with a translation that
keeps its fields, and the catalog holds nothing the code does not mark.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpulab import cli, i18n
from gpulab.i18n import _, ngettext

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpulab_tools_messages", REPO / "tools" / "messages.py")
messages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(messages)

NO_LOCALE = dict.fromkeys(i18n.LANGUAGE_VARIABLES)  # CliRunner's env: None unsets a variable
CHINESE = {**NO_LOCALE, "LANG": "zh_CN.UTF-8"}
ENGLISH = {**NO_LOCALE, "LANG": "en_US.UTF-8"}


def test_every_marked_message_has_a_translation_and_the_catalog_nothing_stale():
    assert messages.problems(i18n.catalog_path()) == []


def _package(tmp_path: Path, source: str) -> Path:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(source)
    return package


def test_the_check_finds_new_stale_untranslated_and_misfielded_messages(tmp_path):
    package = _package(tmp_path, 'from .i18n import _\nx = _("kept")\ny = _("new {name}", name=1)\n'
                                 'z = _("moved {n}", n=2)\n')
    po = tmp_path / "gpulab.po"
    po.write_bytes(messages.updated(po, package))
    catalog = messages.read_catalog(po)
    catalog["kept"].string = "保留"
    catalog["moved {n}"].string = "字段不对 {count}"
    catalog.add("stale", "过时")
    po.write_bytes(messages.render(catalog))

    found = "\n".join(messages.problems(po, package))
    assert "msgid 'stale' is marked nowhere" in found
    assert "msgid 'new {name}' has no translation" in found
    assert "msgid 'moved {n}': the translation's fields ['count'] are not among the msgid's ['n']" in found
    assert "'kept'" not in found

    po.write_bytes(messages.updated(po, package))  # what `make messages` does: "stale" goes, the rest stays
    catalog = messages.read_catalog(po)
    assert "stale" not in catalog and catalog["kept"].string == "保留"

    (package / "mod.py").write_text('from .i18n import _\nx = _("kept")\nw = _("added")\n')
    assert "msgid 'added' is marked in" in "\n".join(messages.problems(po, package))


def test_a_translation_written_by_hand_on_one_line_passes(tmp_path):
    long = "a message long enough that Babel wraps it in the catalog, " * 3 + "{field}"
    package = _package(tmp_path, f'from .i18n import _\nx = _("{long}", field=1)\n')
    po = tmp_path / "gpulab.po"
    po.write_bytes(messages.updated(po, package))
    text = po.read_text()
    assert text.count('msgstr ""') == 2  # the header's and the message's
    before, _msgstr, after = text.rpartition('msgstr ""')
    po.write_text(before + 'msgstr "一条很长的消息，写在一行里，比 Babel 换行的宽度还长：' + "很长" * 40 + '{field}"' + after)
    assert messages.problems(po, package) == []


def test_the_check_finds_marks_extraction_misses_and_a_shadowed_underscore(tmp_path):
    package = _package(tmp_path, 'from .i18n import _\n'
                                 'def f(name):\n'
                                 '    for _ in range(2):\n'
                                 '        pass\n'
                                 '    return _(f"hello {name}") + f"{_(\'inside\')}"\n')
    found = "\n".join(messages.marking_problems(package))
    assert "mod.py:3: binds `_`" in found
    assert "mod.py:5: _() of a message built at run time" in found
    assert "mod.py:5: _() inside an f-string" in found


@pytest.mark.parametrize("environ, expected", [
    ({}, "en"),
    ({"LANG": "zh_CN.UTF-8"}, "zh_CN"),
    ({"LANG": "zh_TW.UTF-8"}, "zh_CN"),
    ({"LANG": "zh"}, "zh_CN"),
    ({"LC_MESSAGES": "zh_CN.UTF-8", "LANG": "en_US.UTF-8"}, "zh_CN"),
    ({"LC_ALL": "en_US.UTF-8", "LC_MESSAGES": "zh_CN.UTF-8"}, "en"),
    ({"LANGUAGE": "zh_CN:en", "LC_ALL": "C.UTF-8"}, "zh_CN"),
    ({"LANGUAGE": "fr_FR:zh_CN", "LANG": "en_US.UTF-8"}, "zh_CN"),  # no French: the next preference
    ({"LANGUAGE": "en:zh_CN"}, "en"),  # English is the msgids' own language: it needs no catalog
    ({"LANGUAGE": "", "LANG": "zh_CN.UTF-8"}, "zh_CN"),  # empty is unset
    ({"LANG": "C"}, "en"),
    ({"LANG": "de_DE.UTF-8"}, "en"),
])
def test_the_language_is_chosen_as_gettext_chooses(environ, expected):
    assert i18n.language(environ) == expected


def test_messages_follow_the_environment_of_each_call(monkeypatch):
    monkeypatch.setenv("LANGUAGE", "zh_CN")
    assert _("no faults set") == "没有设置故障"
    assert _("{node}: cleared {fault}", node="gpu-node-1", fault="gpu-unhealthy (GPU 1)") == \
        "gpu-node-1：已清除 gpu-unhealthy (GPU 1)"
    assert ngettext("stopped {n} container left running by a node agent that died",
                    "stopped {n} containers left running by a node agent that died", 3).startswith("已停止 3 个容器")
    monkeypatch.setenv("LANGUAGE", "en")
    assert _("no faults set") == "no faults set"
    assert ngettext("stopped {n} container left running by a node agent that died",
                    "stopped {n} containers left running by a node agent that died", 1) == \
        "stopped 1 container left running by a node agent that died"


def test_the_catalog_is_read_from_its_po_alone(tmp_path, monkeypatch):
    """Compiled in memory: a package with the .po and no .mo (a fresh install, a checkout) speaks Chinese, and
    writes nothing (the grading jail mounts gpulab/ read-only)."""
    locale = tmp_path / "locale"
    shutil.copytree(i18n.LOCALE_DIR, locale)
    assert sorted(p.name for p in locale.rglob("*") if p.is_file()) == ["gpulab.po"]
    monkeypatch.setattr(i18n, "LOCALE_DIR", locale)
    monkeypatch.setenv("LANGUAGE", "zh_CN")
    i18n._translations.cache_clear()
    try:
        assert _("none") == "无"
    finally:
        i18n._translations.cache_clear()
    assert sorted(p.name for p in locale.rglob("*") if p.is_file()) == ["gpulab.po"]


def test_columns_line_up_with_chinese_headers():
    assert i18n.cells("节点 NODE") == 9
    assert i18n.pad("节点", 6) + "|" == "节点  |"
    assert i18n.pad("too long", 3) == "too long"


# -- the CLI in both languages ----------------------------------------------------------------------


def run(env: dict, *args: str):
    return CliRunner().invoke(cli.main, list(args), env=env)


def test_a_usage_error_of_gpulab_in_both_languages(tmp_path):
    home = {"GPULAB_HOME": str(tmp_path)}
    en = run({**ENGLISH, **home}, "quiz")
    zh = run({**CHINESE, **home}, "quiz")
    assert en.exit_code == zh.exit_code == 2
    assert en.output == "gpulab: error: name a section (e.g. `gpulab quiz 03`) or pass --check\n"
    assert zh.output == "gpulab：错误：请指定一节（例如 `gpulab quiz 03`），或者加上 --check\n"


def test_a_bad_value_is_explained_in_chinese_with_the_value_and_the_limits_unchanged(tmp_path):
    result = run({**CHINESE, "GPULAB_HOME": str(tmp_path)}, "load", "svc/llm", "20000")
    assert result.exit_code == 2
    assert result.output == "gpulab：错误：速率 '20000'：必须在每秒 0 到 1000 个请求之间\n"
    result = run({**CHINESE, "GPULAB_HOME": str(tmp_path)}, "report", "--since", "yesterday")
    assert result.exit_code == 2 and "--since 'yesterday'：应为一段时长，例如 90s、15m、2h 或 1d" in result.output


def test_fault_commands_in_both_languages(tmp_path):
    home = {"GPULAB_HOME": str(tmp_path)}
    assert run({**ENGLISH, **home}, "fault", "list").output == "gpulab: error: no cluster yet: `gpulab up` creates one\n"
    result = run({**CHINESE, **home}, "fault", "set", "gpu-unhealthy", "gpu-node-1")
    assert result.exit_code == 1
    assert result.output == "gpulab：错误：还没有集群：`gpulab up` 会创建一个\n"


def test_lesson_language_overrides_the_users(tmp_path):
    """LANGUAGE comes first: a lesson's zh_CN wins over an English LANG, and LC_ALL=C does not stop it."""
    result = run({**NO_LOCALE, "LANGUAGE": "zh_CN", "LC_ALL": "C.UTF-8", "GPULAB_HOME": str(tmp_path)}, "quiz")
    assert "请指定一节" in result.output


def test_click_s_own_usage_errors_keep_their_exit_status_in_chinese(tmp_path):
    result = run({**CHINESE, "GPULAB_HOME": str(tmp_path)}, "quiz", "--bogus")
    assert result.exit_code == 2 and "--bogus" in result.output


def test_a_lesson_sets_chinese_before_it_touches_the_cluster(monkeypatch):
    """setup() sets LANGUAGE first, so the cluster's start-up lines and every `sh("gpulab ...")` are Chinese."""
    from gpulab.cluster import backend
    from gpulab.notebook import lesson

    class Stop(Exception):
        pass

    def no_cluster():
        raise Stop

    monkeypatch.setenv("LANGUAGE", "en")
    monkeypatch.setenv("PATH", os.environ["PATH"])
    monkeypatch.chdir(os.getcwd())
    monkeypatch.setattr(backend, "current", no_cluster)
    with pytest.raises(Stop):
        lesson.setup("00-orientation")
    assert os.environ["LANGUAGE"] == "zh_CN"
    assert i18n.language() == "zh_CN"


def test_components_log_in_english_whatever_starts_them(tmp_path, monkeypatch):
    """`gpulab up` in a Chinese lesson starts the node agent and the rest with LANGUAGE=en: logs stay English."""
    from gpulab.cluster.processes import Component, ProcessTable

    monkeypatch.setenv("LANGUAGE", "zh_CN")
    table = ProcessTable(tmp_path)
    code = "from gpulab.i18n import _, language; print(language(), _('none'))"
    proc = table.spawn(Component("echo", [sys.executable, "-c", code], lambda: True))
    assert proc.wait(timeout=60) == 0
    assert table.log("echo").read_text().splitlines()[-1] == "en none"


def test_a_topology_s_mistakes_in_chinese_keep_file_field_and_values(tmp_path):
    topology = tmp_path / "bad.yaml"
    topology.write_text("apiVersion: gpulab.io/v1alpha1\nkind: Topology\nnodePools:\n- name: GPU\n  count: 1\n")
    result = run({**CHINESE, "GPULAB_HOME": str(tmp_path)}, "up", "--topology", str(topology))
    assert result.exit_code == 2
    assert result.output == (f"gpulab：错误：{topology}: nodePools[0].name: 'GPU' 不是 DNS 标签（小写字母、数字和 '-'）\n")
