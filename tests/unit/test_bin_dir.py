"""GPULAB_BIN_DIR: ready binaries are checked (present, executable, pinned version), never built, no Go asked for."""

from __future__ import annotations

import stat

import pytest
from bin_dir_support import OUTPUT, fake_binary, fake_cni_plugin, kwarg, make_bin_dir
from click.testing import CliRunner

from gpulab import cli, versions
from gpulab.cluster import binaries


@pytest.fixture
def no_go(tmp_path, monkeypatch):
    """An empty build cache and no way to build: with GPULAB_BIN_DIR, neither may be touched."""
    monkeypatch.setenv("GPULAB_CACHE", str(tmp_path / "cache"))

    def refuse(*args, **kwargs):
        pytest.fail("GPULAB_BIN_DIR is set, yet gpulab looked for Go or built something")

    monkeypatch.setattr(binaries, "_go", refuse)
    monkeypatch.setattr(binaries, "_build_locked", refuse)


def use(monkeypatch, bin_dir):
    monkeypatch.setenv("GPULAB_BIN_DIR", str(bin_dir))
    return bin_dir


def problems_of(err: pytest.ExceptionInfo) -> list[str]:
    """The per-problem lines of a BinaryError (indented by two spaces)."""
    return [ln.strip() for ln in str(err.value).splitlines() if ln.startswith("  ")]


def test_pinned_binaries_are_used_without_go(tmp_path, monkeypatch, no_go):
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin"))
    heard: list[str] = []
    found = binaries.ensure(heard.append)
    assert found.paths == {n: bin_dir / n for n in binaries.REQUIRED}
    assert found.kwok_crds == tuple(bin_dir / "kwok-crds" / c for c in binaries.KWOK_CRDS)
    assert found.versions == {
        "kube-apiserver": versions.KUBERNETES, "kube-controller-manager": versions.KUBERNETES,
        "kube-scheduler": versions.KUBERNETES, "etcd": versions.ETCD.lstrip("v"), "kwok": versions.KWOK,
        "metrics-server": versions.METRICS_SERVER, "kube-proxy": versions.KUBERNETES,
        "coredns": versions.COREDNS.lstrip("v"), "cni/bridge": versions.CNI_PLUGINS,
        "cni/host-local": versions.CNI_PLUGINS, "cni/loopback": versions.CNI_PLUGINS,
        "cni/portmap": versions.CNI_PLUGINS, "agnhost": versions.AGNHOST.lstrip("v"),
        "prometheus": versions.PROMETHEUS.lstrip("v"), "prometheus-adapter": versions.PROMETHEUS_ADAPTER,
        "kube-state-metrics": versions.KUBE_STATE_METRICS,
    }
    assert found["kube-proxy"] == bin_dir / "kube-proxy" and found["coredns"] == bin_dir / "coredns"
    # The CNI plugins share one directory, the CNI_PATH.
    assert found.cni_bin_dir == bin_dir / "cni"
    assert {found[f"cni/{p}"] for p in binaries.CNI_PLUGINS} == {found.cni_bin_dir / p for p in binaries.CNI_PLUGINS}
    assert heard == []  # nothing to warn about
    assert not (tmp_path / "cache").exists()


def test_another_patch_release_is_used_with_a_warning(tmp_path, monkeypatch, no_go):
    major, minor, patch = binaries._parse_version(versions.KUBERNETES)
    other = f"v{major}.{minor}.{patch + 1}"
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin", kube_apiserver=f"Kubernetes {other}",
                                            etcd=f"etcd Version: {versions.ETCD.lstrip('v')}-dirty"))
    heard: list[str] = []
    found = binaries.ensure(heard.append)
    assert found.versions["kube-apiserver"] == other
    assert heard == [
        f"warning: GPULAB_BIN_DIR={bin_dir}: etcd is version {versions.ETCD.lstrip('v')}-dirty, pinned "
        f"{versions.ETCD}; using it (same minor version; the course is tested with {versions.ETCD})",
        f"warning: GPULAB_BIN_DIR={bin_dir}: kube-apiserver is version {other}, pinned {versions.KUBERNETES}; "
        f"using it (same minor version; the course is tested with {versions.KUBERNETES})",
    ]


@pytest.mark.parametrize("name, output, found", [
    ("kube-scheduler", "Kubernetes v1.36.4", "v1.36.4"),
    ("kube-controller-manager", "Kubernetes v2.37.2", "v2.37.2"),
    ("etcd", "etcd Version: 3.5.21", "3.5.21"),
    ("kwok", "kwok version v0.7.0 go1.24.1 (linux/amd64)", "v0.7.0"),
    ("metrics-server", "v0.9.0", "v0.9.0"),
    ("kube-proxy", "Kubernetes v1.36.4", "v1.36.4"),
    ("coredns", "CoreDNS-1.13.1\nlinux/amd64, go1.24.1, 5f1a0b7", "1.13.1"),
    ("cni/portmap", "CNI portmap plugin v1.8.0\nCNI protocol versions supported: 0.1.0, 1.1.0", "v1.8.0"),
])
def test_another_minor_version_is_an_error_naming_file_found_and_wanted(tmp_path, monkeypatch, no_go,
                                                                          name, output, found):
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin", **{kwarg(name): output}))
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(lambda m: None)
    rule = binaries.VERSION_RULES[name]
    major, minor, _ = binaries._parse_version(rule.wanted)
    assert problems_of(err) == [
        f"{name}: {bin_dir / name} is version {found}, wanted {rule.wanted} (allowed: v{major}.{minor}.x)"
    ]
    assert str(err.value).startswith(f"GPULAB_BIN_DIR={bin_dir} is not usable (1 problem):\n")


def test_every_problem_is_listed_at_once(tmp_path, monkeypatch, no_go):
    bin_dir = use(monkeypatch, make_bin_dir(
        tmp_path / "bin", skip=("kwok", f"kwok-crds/{binaries.KWOK_CRDS[1]}"),
        kube_apiserver="Kubernetes v1.30.0"))
    (bin_dir / "etcd").chmod(0o644)
    fake_binary(bin_dir / "kube-controller-manager", "Error: unknown flag: --version", exit_code=1)
    fake_binary(bin_dir / "kube-scheduler", "scheduler, version unknown")
    fake_binary(bin_dir / "coredns", "CoreDNS-1.12.0\nlinux/amd64, go1.24.1, 51e11f1")
    (bin_dir / "kube-proxy").unlink()
    (bin_dir / "kube-proxy").mkdir()
    (bin_dir / "cni" / "loopback").unlink()
    # Built without the version stamp: what `go build` of the module gives.
    fake_cni_plugin(bin_dir / "cni" / "bridge", "CNI bridge plugin version unknown\n"
                                                "CNI protocol versions supported: 0.1.0, 1.1.0")
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(lambda m: None)
    msg = str(err.value)
    assert msg.startswith(f"GPULAB_BIN_DIR={bin_dir} is not usable (10 problems):\n")
    assert problems_of(err) == [
        f"etcd: {bin_dir / 'etcd'} is not executable (mode 0644; `chmod +x` it)",
        f"kube-apiserver: {bin_dir / 'kube-apiserver'} is version v1.30.0, wanted {versions.KUBERNETES} "
        f"(allowed: v1.37.x)",
        f"kube-controller-manager: `{bin_dir / 'kube-controller-manager'} --version` failed (exit 1): "
        f"Error: unknown flag: --version; wanted version {versions.KUBERNETES}",
        f"kube-scheduler: `{bin_dir / 'kube-scheduler'} --version` printed no version (expected a line like "
        f"\"Kubernetes {versions.KUBERNETES}\"): scheduler, version unknown; wanted version {versions.KUBERNETES}",
        f"kwok: missing ({bin_dir / 'kwok'})",
        f"kube-proxy: {bin_dir / 'kube-proxy'} is not a file",
        f"coredns: {bin_dir / 'coredns'} is version 1.12.0, wanted {versions.COREDNS} (allowed: v1.14.x)",
        f"cni/bridge: `CNI_COMMAND= {bin_dir / 'cni' / 'bridge'}` printed no version (expected a line like "
        f"\"CNI bridge plugin {versions.CNI_PLUGINS}\"): CNI bridge plugin version unknown; "
        f"wanted version {versions.CNI_PLUGINS}",
        f"cni/loopback: missing ({bin_dir / 'cni' / 'loopback'})",
        f"kwok-crds/{binaries.KWOK_CRDS[1]}: missing ({bin_dir / 'kwok-crds' / binaries.KWOK_CRDS[1]}; "
        "it is in the kwok module, kustomize/crd/bases/)",
    ]
    # ...and what is allowed: every name, every allowed version, the way out.
    last = msg.splitlines()[-1]
    for name in binaries.REQUIRED:
        assert f"{name} {binaries.VERSION_RULES[name].allowed()}" in last
    assert "unset GPULAB_BIN_DIR to build them from the Go module proxy" in last


def test_cni_plugins_are_asked_with_cni_command_empty(tmp_path, monkeypatch, no_go):
    """A plugin tells its version only without CNI_COMMAND; one set in gpulab's environment must not leak in."""
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin"))
    monkeypatch.setenv("CNI_COMMAND", "ADD")
    found = binaries.ensure(lambda m: None)
    assert found.versions["cni/host-local"] == versions.CNI_PLUGINS
    # The same plugin, asked with CNI_COMMAND set, fails: what the check would have seen.
    import subprocess

    proc = subprocess.run([str(bin_dir / "cni" / "host-local")], capture_output=True, text=True)
    assert proc.returncode == 1 and "required env variables" in proc.stdout


def test_the_cni_directory_missing_is_one_problem_per_plugin(tmp_path, monkeypatch, no_go):
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin", skip=tuple(f"cni/{p}" for p in binaries.CNI_PLUGINS)))
    assert not (bin_dir / "cni").exists()
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(lambda m: None)
    assert problems_of(err) == [f"cni/{p}: missing ({bin_dir / 'cni' / p})" for p in binaries.CNI_PLUGINS]
    assert "(the CNI plugins in cni/, the CNI_PATH)" in str(err.value)


def test_a_binary_for_another_machine_is_reported(tmp_path, monkeypatch, no_go):
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin"))
    (bin_dir / "kwok").write_bytes(b"\x7fELF\x02\x01\x01\x00garbage")  # no shebang, not loadable
    (bin_dir / "kwok").chmod(stat.S_IRWXU)
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(lambda m: None)
    [problem] = problems_of(err)
    assert problem.startswith(f"kwok: `{bin_dir / 'kwok'} --version` could not run: ")
    assert problem.endswith(f"; wanted version {versions.KWOK}")


def test_a_binary_that_hangs_is_reported(tmp_path, monkeypatch, no_go):
    bin_dir = use(monkeypatch, make_bin_dir(tmp_path / "bin"))
    (bin_dir / "etcd").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(binaries, "VERSION_TIMEOUT_S", 0.3)
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(lambda m: None)
    assert problems_of(err) == [
        f"etcd: `{bin_dir / 'etcd'} --version` did not finish within 0.3 s; wanted version {versions.ETCD}"
    ]


@pytest.mark.parametrize("make, what", [(lambda p: None, "does not exist"),
                                        (lambda p: p.write_text(""), "is not a directory")])
def test_bin_dir_that_is_no_directory(tmp_path, monkeypatch, no_go, make, what):
    bin_dir = tmp_path / "nowhere"
    make(bin_dir)
    use(monkeypatch, bin_dir)
    with pytest.raises(binaries.BinaryError) as err:
        binaries.ensure(lambda m: None)
    assert str(err.value).startswith(f"GPULAB_BIN_DIR={bin_dir}: {bin_dir} {what}. It must hold executables named ")


def test_gpulab_build_checks_instead_of_building(tmp_path, monkeypatch, no_go):
    bin_dir = make_bin_dir(tmp_path / "bin")
    result = CliRunner().invoke(cli.main, ["build"], env={"GPULAB_BIN_DIR": str(bin_dir)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"GPULAB_BIN_DIR={bin_dir}: every binary present, executable and of a usable version"
    assert lines[1].split() == ["etcd", versions.ETCD.lstrip("v"), str(bin_dir / "etcd")]
    assert lines[2].split() == ["kube-apiserver", versions.KUBERNETES, str(bin_dir / "kube-apiserver")]

    fake_binary(bin_dir / "kube-scheduler", "Kubernetes v1.36.0")
    (bin_dir / "kwok").unlink()
    result = CliRunner().invoke(cli.main, ["build"], env={"GPULAB_BIN_DIR": str(bin_dir)})
    assert result.exit_code == 1
    assert f"gpulab: error: GPULAB_BIN_DIR={bin_dir} is not usable (2 problems):" in result.output
    assert f"  kube-scheduler: {bin_dir / 'kube-scheduler'} is version v1.36.0, wanted" in result.output
    assert f"  kwok: missing ({bin_dir / 'kwok'})" in result.output


def test_fake_outputs_match_the_rules():
    """The fakes print what the real programs print; every rule reads its fake's version."""
    import re

    assert set(OUTPUT) == set(binaries.REQUIRED) == set(binaries.VERSION_RULES)
    for name, rule in binaries.VERSION_RULES.items():
        assert re.search(rule.pattern, OUTPUT[name])
        # (Prometheus' and kube-state-metrics' first lines go on with the branch; the adapter's is a path.)
        assert OUTPUT[name].splitlines()[0].startswith(rule.sample()) or name == "kwok"
