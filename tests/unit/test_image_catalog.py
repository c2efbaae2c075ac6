"""Images whose program runs (gpulab.runtime.images): busybox, nginx, agnhost — what runs and what is mounted."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpulab.runtime import images


def test_a_command_replaces_entrypoint_and_cmd_and_args_replace_cmd():
    """As a container runtime decides: command → command + args; args alone → ENTRYPOINT + args; neither → CMD."""
    agnhost = images.Entrypoint(images.AGNHOST_REPOSITORY, ("/agnhost",), Path("/x/agnhost"), cmd=("pause",))
    assert agnhost.command([], []) == ["/agnhost", "pause"]
    assert agnhost.command([], ["netexec", "--http-port=8080"]) == ["/agnhost", "netexec", "--http-port=8080"]
    assert agnhost.command(["sh", "-c", "true"], []) == ["sh", "-c", "true"]
    assert agnhost.command(["sh"], ["-c", "true"]) == ["sh", "-c", "true"]
    # No ENTRYPOINT: CMD is the command itself.
    bare = images.Entrypoint("x", (), cmd=("sh",))
    assert bare.command([], []) == ["sh"] and bare.command([], ["echo", "hi"]) == ["echo", "hi"]
    # The python images: the host's python3, args after it (unchanged).
    python = images.ImageCatalog(list(images.HOST_PROGRAMS)).lookup("python:3.11")
    assert python is not None and python.command([], ["-c", "print(1)"]) == ["python3", "-c", "print(1)"]


def test_every_tag_of_busybox_nginx_and_agnhost_is_known(tmp_path: Path):
    catalog = images.ImageCatalog([*images.agnhost_images(tmp_path / "agnhost"), *images.busybox_images(),
                                   *images.nginx_images(tmp_path / "nginx", root_in_userns=False)])
    for image in ("busybox", "busybox:1.36", "docker.io/library/busybox:latest", "library/busybox@sha256:" + "0" * 64):
        assert catalog.lookup(image).cmd == ("sh",), image
    for image in ("nginx", "nginx:1.27-alpine", "docker.io/library/nginx:stable"):
        assert catalog.lookup(image).argv == ("/docker-entrypoint.sh",), image
    agnhost = catalog.lookup("registry.k8s.io/e2e-test-images/agnhost:2.53")
    assert agnhost.argv == ("/agnhost",) and agnhost.cmd == ("pause",)
    assert [(m.host_path, m.container_path, m.read_only) for m in agnhost.mounts()] == [
        (str(tmp_path / "agnhost"), "/agnhost", True)]
    assert catalog.lookup("busyboxy") is None and catalog.lookup("quay.io/nginx/nginx") is None


def test_busybox_runs_the_hosts_busybox_with_the_applets_name():
    busybox = images.busybox_images()[0]
    assert busybox.argv == (images.host_program("busybox"),) and busybox.mounts() == []
    assert busybox.command([], []) == [busybox.argv[0], "sh"]
    assert busybox.command([], ["sh", "-c", "echo hi"]) == [busybox.argv[0], "sh", "-c", "echo hi"]
    assert busybox.needs == (busybox.argv[0], "busybox")


def test_a_missing_host_program_names_the_debian_package(tmp_path: Path):
    gone = images.Entrypoint("nginx", ("/docker-entrypoint.sh",), needs=(str(tmp_path / "nginx"), "nginx-light"))
    why = gone.missing()
    assert why is not None and "nginx-light" in why and "apt-get install -y nginx-light" in why
    (tmp_path / "nginx").touch()
    assert gone.missing() is None
    built = images.Entrypoint("agnhost", ("/agnhost",), tmp_path / "agnhost")
    assert "agnhost is missing" in (built.missing() or "")


@pytest.mark.parametrize("root_in_userns", [False, True])
def test_nginx_files_are_the_official_images_made_to_run_as_the_pods_user(tmp_path: Path, root_in_userns: bool):
    root = tmp_path / "nginx"
    nginx = images.nginx_images(root, root_in_userns)[0]
    assert nginx.cmd == ("nginx", "-g", "daemon off;")
    assert nginx.needs == (images.host_program("nginx", "/usr/sbin"), images.NGINX_PACKAGE)
    mounts = {m.container_path: (Path(m.host_path), m.read_only) for m in nginx.mounts()}
    assert mounts == {"/docker-entrypoint.sh": (root / "docker-entrypoint.sh", True),
                      "/etc/nginx/nginx.conf": (root / "nginx.conf", True),
                      "/etc/nginx/conf.d": (root / "conf.d", True),
                      "/usr/share/nginx/html": (root / "html", True)}
    assert "<h1>Welcome to nginx!</h1>" in (root / "html" / "index.html").read_text()
    assert (root / "docker-entrypoint.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "html" / "index.html").stat().st_mode & 0o777 == 0o644
    conf = (root / "nginx.conf").read_text()
    # Nothing where an ordinary account cannot write; not a daemon (CMD says so, as the official image's).
    for line in ("pid        /tmp/nginx.pid;", "error_log  stderr warn;", "master_process  off;",
                 "client_body_temp_path  /tmp/client_temp;", f"access_log  {images.NGINX_ACCESS_LOG}  main;",
                 "include /etc/nginx/conf.d/*.conf;"):
        assert line in conf
    assert "daemon" not in conf and "/var/" not in conf
    assert ("user  root root;" in conf) == root_in_userns
    assert "listen       80;" in (root / "conf.d" / "default.conf").read_text()
    # Written again (the next node agent): the same files.
    images.nginx_images(root, root_in_userns)
    assert (root / "nginx.conf").read_text() == conf


@pytest.mark.skipif(not shutil.which("nginx", path="/usr/sbin:/usr/bin"), reason="needs Debian's nginx-light")
def test_the_generated_nginx_conf_passes_nginx_t(tmp_path: Path):
    """`nginx -t` on the generated config, with the container paths replaced by the generated files."""
    root = tmp_path / "nginx"
    images.nginx_images(root, root_in_userns=False)
    conf = (root / "nginx.conf").read_text().replace("/etc/nginx/conf.d", str(root / "conf.d"))
    conf = conf.replace("/tmp/", f"{tmp_path}/")
    (tmp_path / "test.conf").write_text(conf)
    nginx = images.host_program("nginx")
    proc = subprocess.run([nginx, "-e", "stderr", "-t", "-c", str(tmp_path / "test.conf"), "-g", "daemon off;"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "syntax is ok" in proc.stderr


def test_a_container_whose_host_program_is_missing_waits_and_says_what_to_install(tmp_path: Path, monkeypatch):
    """Never simulated instead: CreateContainerError, and a Warning event naming the Debian package."""
    from types import SimpleNamespace

    from gpulab.runtime import pod as pod_module
    from gpulab.runtime.imagemanager import ImageManager
    from gpulab.runtime.pod import PodWorker

    recorded: list[tuple[str, str, str]] = []
    monkeypatch.setattr(pod_module.events, "record",
                        lambda client, obj, reason, message, type_, **kw: recorded.append((type_, reason, message)))
    gone = str(tmp_path / "no-nginx")
    catalog = images.ImageCatalog([images.Entrypoint("nginx", ("/docker-entrypoint.sh",), cmd=("nginx",),
                                                     needs=(gone, "nginx-light"))])
    agent = SimpleNamespace(client=None, devices=None, pods_dir=tmp_path, images=catalog,
                            image_manager=ImageManager(tmp_path / "nodes", lambda node: 1e9))
    pod = {"metadata": {"namespace": "ns", "name": "web", "uid": "u-1"},
           "spec": {"nodeName": "cpu-node-1", "containers": [{"name": "main", "image": "nginx:1.27"}]}}
    worker = PodWorker(agent, pod)
    c = worker.main[0]
    assert not c.simulated
    worker._start(c)
    assert c.state == "waiting" and c.waiting_reason == "CreateContainerError"
    assert "sudo apt-get install -y nginx-light" in c.waiting_message
    # The image is on the node (the kubelet checks that first); its program is not.
    assert recorded == [("Normal", "Pulled", 'Container image "nginx:1.27" already present on machine and can be '
                                             "accessed by the pod"),
                        ("Warning", "Failed", f"Error: {c.waiting_message}")]


def test_one_tag_of_an_image_may_run_differently_lesson_06s_baked_weights(tmp_path: Path):
    """gpulab/llm-server:0.1-7b-weights serves the model inside it by default; the other tags need args."""
    from gpulab.cluster.nodeagent import baked_weights_image
    from gpulab.fakegpu import llmserver
    from gpulab.runtime import imagemanager

    baked = baked_weights_image(tmp_path / "images")
    catalog = images.ImageCatalog([images.Entrypoint(llmserver.IMAGE_REPOSITORY, ("python3", llmserver.CONTAINER_PATH)),
                                   baked])
    assert catalog.lookup(imagemanager.BAKED_WEIGHTS_IMAGE) is baked
    assert catalog.lookup(llmserver.IMAGE).cmd == () and catalog.lookup("gpulab/llm-server:0.2").cmd == ()
    assert baked.command([], []) == ["python3", llmserver.CONTAINER_PATH, "serve", "--model", "/models/llama-7b"]
    [model] = [Path(m.host_path) for m in baked.mounts() if m.container_path == "/models/llama-7b"]
    assert llmserver.read_model(str(model))["size_gib"] == round(imagemanager.BAKED_WEIGHTS_BYTES / 2**30, 2)
