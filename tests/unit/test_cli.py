"""The CLI is a thin layer: these check the wiring and the exit codes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpulab import cli, versions


def run(*args: str, home=None):
    env = {"GPULAB_HOME": str(home)} if home else None
    return CliRunner().invoke(cli.main, list(args), env=env)


def test_kubeconfig_path_follows_gpulab_home(tmp_path):
    result = run("kubeconfig", home=tmp_path)
    assert result.exit_code == 0
    assert result.output.strip() == str(tmp_path / "cluster" / "kubeconfig")


def test_status_without_a_cluster_says_how_to_make_one(tmp_path):
    result = run("status", home=tmp_path)
    assert result.exit_code == 1
    assert "gpulab up" in result.output


def test_progress_lists_every_section(tmp_path):
    result = run("progress", home=tmp_path)
    assert result.exit_code == 0
    for section in ("01-resource-model", "04-sharing", "09-self-test"):
        assert section in result.output


def test_quiz_check_and_unknown_section(tmp_path):
    assert "banks" in run("quiz", "--check", home=tmp_path).output
    result = run("quiz", "42", home=tmp_path)
    assert result.exit_code == 2
    assert "unknown quiz section '42'" in result.output


def test_versions_lists_the_pins():
    result = run("versions")
    assert result.exit_code == 0
    assert "v1.37.2" in result.output and "v3.6.16" in result.output and "v0.8.0" in result.output
    for _, version, _ in versions.TABLE:
        assert f" {version} " in result.output


def test_the_readme_versions_table_follows_versions_table():
    """README's "## 版本" table is versions.TABLE in Chinese: the same rows, in order, with the same versions."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## 版本\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split("|")[1:-1] for ln in section.splitlines() if ln.startswith("| ")][1:]  # less the header
    assert [cells[1].strip() for cells in rows] == [version for _, version, _ in versions.TABLE]


def test_load_rejects_malformed_values_before_touching_the_cluster(tmp_path):
    for args, message in (
        (("svc/llm", "lots"), "rate 'lots': expected requests per second"),
        (("svc/llm", "20000"), "must be between 0 and 1000"),
        (("svc/llm", "nan"), "must be between 0 and 1000"),
        (("deploy/llm", "5"), "traffic goes to a Service, not a 'deploy'"),
        (("llm", "5"), "expected svc/NAME"),
        (("svc/LLM_1", "5"), "is not a valid Service name"),
        (("svc/llm", "5", "--max-tokens", "0"), "--max-tokens 0: must be between 1 and 4096"),
    ):
        result = run("load", *args, home=tmp_path)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


def test_load_without_a_cluster_says_how_to_start_one(tmp_path):
    result = CliRunner().invoke(cli.main, ["load", "svc/llm", "5"],
                                env={"GPULAB_HOME": str(tmp_path), "KUBECONFIG": ""})
    assert result.exit_code == 1 and "gpulab up" in result.output


def test_report_rejects_a_bad_window(tmp_path):
    result = run("report", "--since", "yesterday", home=tmp_path)
    assert result.exit_code == 2 and "--since 'yesterday'" in result.output
