"""Images whose real program gpulab has: their entrypoint runs as the container's process.

No image's files are ever fetched (pulling is simulated as time over the node's network:
:mod:`gpulab.runtime.imagemanager`). A container with ``command`` runs that command with
the host's programs; a container without one runs its image's entrypoint when
gpulab has the image's program — CoreDNS's and agnhost's, built from source with the control
plane, or the host's ``python3``, ``busybox`` and ``nginx`` (Debian's packages) for the ``python``,
``busybox`` and ``nginx`` images — and is simulated otherwise (:mod:`gpulab.runtime.containers`). An
image whose host program is missing does not start: an event names the package to install. The
composition root registers what it has (:class:`ImageCatalog`); the program is
mounted read-only at the path the real image keeps it, so a pod that names
``/coredns`` in its ``command`` finds it too.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from .sandbox import DEFAULT_PATH, Mount


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    """One image's program: its repository (any tag or digest) or one ``repository:tag`` of it, ENTRYPOINT, and
    the host binary behind it."""

    repository: str
    argv: tuple[str, ...]
    # The program built for it, mounted at argv[0]; None: the host's own (a container sees the host's /usr).
    binary: Path | None = None
    # Where ``binary`` is mounted when argv[0] is its interpreter (a script run by the host's python3).
    mount_at: str | None = None
    # The image's CMD: the arguments when the pod gives neither ``command`` nor ``args`` (agnhost's
    # ``pause``). With an empty ``argv`` (no ENTRYPOINT, as busybox's) it is the command itself.
    cmd: tuple[str, ...] = ()
    # More of the image's files, read-only: (host path, container path), e.g. nginx's config and welcome page.
    files: tuple[tuple[Path, str], ...] = ()
    # The host's program the image runs and the Debian package that has it: without the program the
    # container cannot start (an event says what to install), rather than being simulated.
    needs: tuple[str, str] | None = None

    def mounts(self) -> list[Mount]:
        own = [Mount(str(self.binary), self.mount_at or self.argv[0], read_only=True)] if self.binary else []
        return own + [Mount(str(host), path, read_only=True) for host, path in self.files]

    def command(self, command: list[str], args: list[str]) -> list[str]:
        """What runs, as a container runtime decides: the pod's ``command`` replaces ENTRYPOINT and CMD,
        its ``args`` replace CMD."""
        if command:
            return [*command, *args]
        return [*self.argv, *(args or self.cmd)]

    def missing(self) -> str | None:
        """Why the image's program cannot run here (what to install), or None."""
        if self.binary is not None and not self.binary.exists():
            return f"{self.binary} is missing (gpulab build puts it there)"
        if self.needs and not Path(self.needs[0]).exists():
            program, package = self.needs
            return (f"the host has no {program}: install Debian's {package} package "
                    f"(sudo apt-get install -y {package}) on the machine running gpulab; "
                    "the container starts once it is there")
        return None


def image_repository(image: str) -> str:
    """``registry.k8s.io/coredns/coredns:v1.14.7`` → ``registry.k8s.io/coredns/coredns`` (tag and digest dropped).

    Both kinds of image gpulab runs are known by it: those with a real program (here) and the GPU
    stack's built-in programs (:mod:`gpulab.runtime.programs`).
    """
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


#: Images whose program every machine gpulab runs on has: the host's python3 (apt.txt) is the official
#: Python image's entrypoint (its CMD is ``python3``; a pod's ``args`` follow it, as a runtime appends them).
HOST_PROGRAMS = tuple(Entrypoint(repo, ("python3",)) for repo in ("python", "library/python",
                                                                   "docker.io/library/python"))


def _repositories(name: str) -> tuple[str, ...]:
    """An official Docker Hub image's names: ``nginx``, ``library/nginx``, ``docker.io/library/nginx``."""
    return (name, f"library/{name}", f"docker.io/library/{name}")


def host_program(name: str, where: str = "/usr/bin") -> str:
    """Where the host keeps ``name`` on a container's PATH (``/usr/sbin/nginx``); where Debian puts it when absent."""
    return shutil.which(name, path=DEFAULT_PATH) or f"{where}/{name}"


#: The upstream Kubernetes test image: ENTRYPOINT ``/agnhost``, CMD ``pause``; gpulab builds its program
#: from the k8s.io/kubernetes module (test/images/agnhost) and mounts it at /agnhost.
AGNHOST_REPOSITORY = "registry.k8s.io/e2e-test-images/agnhost"


#: More of the image, as its Dockerfile adds them to / (its working directory): porter's TLS certificate and
#: key, which `agnhost porter` opens as ``localhost.crt``/``localhost.key``. `gpulab build` copies them from the
#: module's test/images/agnhost/ beside the program, at these paths.
AGNHOST_FILES = ("porter/localhost.crt", "porter/localhost.key")


def agnhost_images(binary: Path) -> list[Entrypoint]:
    # (Ready binaries in GPULAB_BIN_DIR may come without them: then only porter's TLS ports fail.)
    files = tuple((binary.parent / f, "/" + Path(f).name) for f in AGNHOST_FILES if (binary.parent / f).is_file())
    return [Entrypoint(AGNHOST_REPOSITORY, ("/agnhost",), binary, cmd=("pause",), files=files)]


#: The monitoring add-on's images, as upstream publishes them: (repositories, ENTRYPOINT, CMD). gpulab builds
#: each program from the Go module proxy and mounts it at the ENTRYPOINT's path.
PROMETHEUS_REPOSITORIES = ("quay.io/prometheus/prometheus", "prom/prometheus", "docker.io/prom/prometheus")
KUBE_STATE_METRICS_REPOSITORY = "registry.k8s.io/kube-state-metrics/kube-state-metrics"
PROMETHEUS_ADAPTER_REPOSITORY = "registry.k8s.io/prometheus-adapter/prometheus-adapter"


def monitoring_images(prometheus: Path, adapter: Path, kube_state_metrics: Path) -> list[Entrypoint]:
    """Prometheus (``/bin/prometheus``, CMD its config and data paths), prometheus-adapter (``/adapter``) and
    kube-state-metrics (``/kube-state-metrics --port=8080 --telemetry-port=8081``), as their Dockerfiles say."""
    return [
        *(Entrypoint(repo, ("/bin/prometheus",), prometheus,
                     cmd=("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"))
          for repo in PROMETHEUS_REPOSITORIES),
        Entrypoint(PROMETHEUS_ADAPTER_REPOSITORY, ("/adapter",), adapter),
        Entrypoint(KUBE_STATE_METRICS_REPOSITORY, ("/kube-state-metrics", "--port=8080", "--telemetry-port=8081"),
                   kube_state_metrics),
    ]


def busybox_images() -> list[Entrypoint]:
    """busybox: no ENTRYPOINT, CMD ``sh``, and /bin full of busybox's applets.

    The host's busybox (Debian's ``busybox``) runs with the applet's name: the pod's ``args`` (``[sh, -c,
    ...]``) are an applet and its arguments, and with none it runs ``busybox sh``, which reads the empty
    stdin of a container without ``stdin: true`` and exits 0, as the real image's does. A ``command``
    runs the host's programs, as for every image.
    """
    busybox = host_program("busybox")
    return [Entrypoint(repo, (busybox,), cmd=("sh",), needs=(busybox, "busybox"))
            for repo in _repositories("busybox")]


#: What Debian package has the nginx that the nginx image runs (nginx-core or nginx-full serve as well).
NGINX_PACKAGE = "nginx-light"

# The official image's /usr/share/nginx/html/index.html and 50x.html.
def _nginx_page(title: str, body: str) -> str:
    return f"""<!DOCTYPE html>
<html>
<head>
<title>{title}</title>
<style>
html {{ color-scheme: light dark; }}
body {{ width: 35em; margin: 0 auto;
font-family: Tahoma, Verdana, Arial, sans-serif; }}
</style>
</head>
<body>
{body}</body>
</html>
"""


NGINX_INDEX = _nginx_page("Welcome to nginx!", """<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and
working. Further configuration is required.</p>

<p>For online documentation and support please refer to
<a href="http://nginx.org/">nginx.org</a>.<br/>
Commercial support is available at
<a href="http://nginx.com/">nginx.com</a>.</p>

<p><em>Thank you for using nginx.</em></p>
""")
NGINX_50X = _nginx_page("Error", """<h1>An error occurred.</h1>
<p>Sorry, the page you are looking for is currently unavailable.<br/>
Please try again later.</p>
<p>If you are the system administrator of this resource then you should check
the error log for details.</p>
<p><em>Faithfully yours, nginx.</em></p>
""")
# The official image's conf.d/default.conf (IPv4 only: its entrypoint adds [::]:80 only where IPv6 is on).
NGINX_DEFAULT_CONF = """server {
    listen       80;
    server_name  localhost;

    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }

    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
"""
# The access log: a FIFO the entrypoint copies to the container's stdout (the pod's user may not open
# /dev/stdout, a pipe the node agent owns); a file in /tmp when nginx runs without the entrypoint.
NGINX_ACCESS_LOG = "/tmp/nginx-access.log"
NGINX_ENTRYPOINT = f"""#!/bin/sh
# gpulab's /docker-entrypoint.sh of the nginx image: the host's nginx with the image's configuration.
# Its error log is stderr from the start (-e), and its access log reaches stdout through a FIFO.
if [ "$1" = nginx ] || [ "$1" = nginx-debug ]; then
    shift
    rm -f {NGINX_ACCESS_LOG} && mkfifo -m 600 {NGINX_ACCESS_LOG}
    cat {NGINX_ACCESS_LOG} &
    exec nginx -e stderr "$@"
fi
exec "$@"
"""


def nginx_conf(root_in_userns: bool) -> str:
    """The official image's nginx.conf, made to run as the pod's user: pid, temp files in /tmp, logs to the
    container's output, one process (``master_process off``: no worker to switch users to). Errors from
    ``warn`` up: a pod's log starts empty (the official ``notice`` adds four start-up lines) and shows requests."""
    user = ("# uid 0 of a user namespace that maps only one account: no user to switch to or chown for.\n"
            "user  root root;\n") if root_in_userns else ""
    return f"""# gpulab's nginx.conf for the nginx image (the official image's, run as the pod's user).
{user}master_process  off;
worker_processes  1;

error_log  stderr warn;
pid        /tmp/nginx.pid;

events {{
    worker_connections  1024;
}}

http {{
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;

    log_format  main  '$remote_addr - $remote_user [$time_local] "$request" '
                      '$status $body_bytes_sent "$http_referer" '
                      '"$http_user_agent" "$http_x_forwarded_for"';

    access_log  {NGINX_ACCESS_LOG}  main;

    client_body_temp_path  /tmp/client_temp;
    proxy_temp_path        /tmp/proxy_temp;
    fastcgi_temp_path      /tmp/fastcgi_temp;
    uwsgi_temp_path        /tmp/uwsgi_temp;
    scgi_temp_path         /tmp/scgi_temp;

    sendfile        on;
    keepalive_timeout  65;
    # As Debian's nginx.conf: its mime.types outgrows the default (a start-up warning otherwise).
    types_hash_max_size  2048;

    include /etc/nginx/conf.d/*.conf;
}}
"""


def nginx_images(root: Path, root_in_userns: bool) -> list[Entrypoint]:
    """nginx: ENTRYPOINT ``/docker-entrypoint.sh``, CMD ``nginx -g "daemon off;"``, run by the host's nginx.

    Writes the image's files under ``root`` (the entrypoint, nginx.conf, conf.d/default.conf and the
    welcome page), which every container of the image sees read-only at the official image's paths; a
    pod's own volume on /usr/share/nginx/html or /etc/nginx/conf.d covers them, as in the real image.
    ``root_in_userns``: containers run as uid 0 of a user namespace (gpulab run by an ordinary account).
    """
    files = {
        "docker-entrypoint.sh": NGINX_ENTRYPOINT,
        "nginx.conf": nginx_conf(root_in_userns),
        "conf.d/default.conf": NGINX_DEFAULT_CONF,
        "html/index.html": NGINX_INDEX,
        "html/50x.html": NGINX_50X,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        path.write_text(text)
        path.chmod(0o755 if rel.endswith(".sh") else 0o644)
    root.chmod(0o755)
    nginx = host_program("nginx", "/usr/sbin")
    mounts = ((root / "nginx.conf", "/etc/nginx/nginx.conf"), (root / "conf.d", "/etc/nginx/conf.d"),
              (root / "html", "/usr/share/nginx/html"))
    return [Entrypoint(repo, ("/docker-entrypoint.sh",), root / "docker-entrypoint.sh",
                       cmd=("nginx", "-g", "daemon off;"), files=mounts, needs=(nginx, NGINX_PACKAGE))
            for repo in _repositories("nginx")]


class ImageCatalog:
    def __init__(self, entries: list[Entrypoint] | None = None):
        self.entries = {e.repository: e for e in entries or []}

    def lookup(self, image: str) -> Entrypoint | None:
        """The entry of ``image``'s own tag when there is one (an image that differs by tag), else of its repository."""
        return self.entries.get(image.split("@", 1)[0]) or self.entries.get(image_repository(image))
