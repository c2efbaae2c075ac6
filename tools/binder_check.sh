#!/usr/bin/env bash
# Check the repo2docker files (postBuild, start) without Docker, the way the image
# runs them: as an unprivileged user, on a fresh home directory, in the repository.
#
#   sudo tools/binder_check.sh USER [BIN_DIR]
#
#   USER      an existing user other than root (e.g. `useradd -m r2dcheck`); the
#             check's own processes are told apart by their GPULAB_HOME, so other
#             work of that user is left alone
#   BIN_DIR   ready control-plane binaries, readable by USER (default:
#             $GPULAB_BIN_DIR, else /opt/gpulab-bin); postBuild then verifies them
#             instead of building (~12 minutes)
#
# Steps: postBuild (and JupyterLab's settings override it writes into the environment);
# then start with a command that waits for start's background `gpulab up` (its log,
# $GPULAB_HOME/up.log, ends "gpulab up exited with N"), runs `gpulab status` and, in the
# shell the server's config gives its terminals, `kubectl get nodes` with start's KUBECONFIG.
# JUPYTERHUB_USER is set and the repository is outside the fresh home, as on
# JupyterHub with `repo2docker --target-repo-dir`, so start's copy of notebooks/ and
# labs/ into the home is checked as well. Prints the memory (RSS) of the cluster's
# processes. Always ends with `gpulab down --purge` and checks that nothing of the
# check is left running. Exit 0: all of it worked.
#
# The Python environment is the checkout's .venv (GPULAB_CHECK_ENV_BIN=DIR: another
# directory holding `gpulab`); USER must be able to run it, and to write into it
# (postBuild writes JupyterLab's settings override there, as into an image's).
set -euo pipefail

repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
say() { printf 'binder_check: %s\n' "$*"; }
fail() {
    say "FAIL: $*"
    exit 1
}

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    sed -n '4,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
fi
[ "$(id -u)" = 0 ] || fail "run as root: the check switches to USER with setpriv"
user="$1"
uid="$(id -u "$user" 2>/dev/null)" || fail "no user $user (create one: useradd -m NAME)"
gid="$(id -g "$user")"
[ "$uid" != 0 ] || fail "USER must not be root: the image runs its scripts as a non-root user"
bin_dir="${2:-${GPULAB_BIN_DIR:-/opt/gpulab-bin}}"
env_bin="${GPULAB_CHECK_ENV_BIN:-$repo/.venv/bin}"
[ -x "$env_bin/gpulab" ] || fail "$env_bin/gpulab not found (make install, or set GPULAB_CHECK_ENV_BIN)"

# USER, with nothing of root's environment but what the image would set.
as_user() {
    (cd "$repo" && setpriv --reuid="$uid" --regid="$gid" --init-groups \
        env -i HOME="$home" USER="$user" LOGNAME="$user" SHELL=/bin/bash LANG=C.UTF-8 \
        PATH="$env_bin:/usr/local/bin:/usr/bin:/bin" GPULAB_BIN_DIR="$bin_dir" \
        JUPYTERHUB_USER="$user" "$@")
}

# Processes of this check: those with its GPULAB_HOME in their environment (gpulab
# and the cluster's components) or with their root or working directory in its
# home (pod sandboxes).
check_pids() {
    local pid dir
    for pid in $(pgrep -u "$uid" || true); do
        if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF "GPULAB_HOME=$gpulab_home"; then
            echo "$pid"
            continue
        fi
        for dir in root cwd; do
            case "$(readlink "/proc/$pid/$dir" 2>/dev/null)/" in
            "$home"/*)
                echo "$pid"
                break
                ;;
            esac
        done
    done
}

finish() {
    local rc=$? left
    if [ -d "$gpulab_home" ]; then # start ran: whatever it started goes
        say "gpulab down --purge"
        as_user gpulab down --purge || rc=1
    fi
    left="$(check_pids)"
    if [ -n "$left" ]; then
        say "FAIL: still running after gpulab down --purge:"
        ps -o pid,rss,args -p "$(echo "$left" | paste -sd,)" | cut -c1-200
        # shellcheck disable=SC2086 # one pid per word
        kill $left 2>/dev/null || true
        rc=1
    fi
    if [ -e "$gpulab_home/cluster" ]; then
        say "FAIL: $gpulab_home/cluster still exists after gpulab down --purge"
        rc=1
    fi
    rm -rf "$home"
    if [ "$rc" = 0 ]; then say "OK"; else say "FAILED (exit $rc)"; fi
    exit "$rc"
}
home="$(mktemp -d "${TMPDIR:-/tmp}/binder-check.XXXXXX")"
gpulab_home="$home/.gpulab"
trap finish EXIT
chown "$uid:$gid" "$home"
chmod 0755 "$home"

say "user $user (uid $uid), fresh home $home, GPULAB_BIN_DIR=$bin_dir, gpulab from $env_bin"
as_user test -r "$bin_dir/kube-apiserver" || fail "$user cannot read $bin_dir"
as_user gpulab --version >/dev/null || fail "$user cannot run $env_bin/gpulab (is its Python in a private \
directory such as /root?); give GPULAB_CHECK_ENV_BIN an environment $user can run, e.g. \
/usr/bin/python3 -m venv /opt/gpulab-env && /opt/gpulab-env/bin/pip install -e $repo"

say "1/2 postBuild"
as_user ./postBuild || fail "postBuild exited with $?"
overrides="$env_bin/../share/jupyter/lab/settings/overrides.d/gpulab.json"
cmp -s "$overrides" "$repo/jupyterlab-overrides.json" ||
    fail "postBuild did not install jupyterlab-overrides.json as $overrides"

# What start execs: wait for its background `gpulab up`, then check the cluster
# and start's copy of the course into the home directory.
read -r -d '' after_start <<'EOF' || true
log="$GPULAB_HOME/up.log"
for _ in $(seq 1 300); do
    grep -q '^gpulab up exited with' "$log" 2>/dev/null && break
    sleep 1
done
echo "---- $log"
cat "$log"
echo "----"
[ "$(pwd)" = "$HOME" ] || { echo "start left the server in $(pwd), not in $HOME"; exit 1; }
for f in notebooks/00-orientation.ipynb labs/01-gpu-pod-spec.ipynb manifests/topologies/default.yaml; do
    [ -f "$HOME/$f" ] || { echo "start did not put $f into $HOME"; exit 1; }
done
grep -qx 'gpulab up exited with 0' "$log" || { echo "gpulab up did not succeed (see the log above)"; exit 1; }
gpulab status
# What a JupyterLab terminal of this server runs: the shell the server's config (start's JUPYTER_CONFIG_PATH) names,
# never a login shell, in the server's environment: start's KUBECONFIG, the environment's gpulab and kubectl 1.37.
terminal="$(python -c 'from jupyter_server.serverapp import ServerApp
app = ServerApp()
app.load_config_file()
print(" ".join(app.terminado_settings.get("shell_command") or ["(the default: $SHELL -l)"]))')"
[ "$terminal" = /bin/bash ] || { echo "the server's terminals would run $terminal, not /bin/bash"; exit 1; }
echo "a terminal runs: $terminal"
$terminal -c '
[ "${KUBECONFIG:-}" = "$(gpulab kubeconfig)" ] || { echo "start set KUBECONFIG=${KUBECONFIG:-}, not $(gpulab kubeconfig)"; exit 1; }
kubectl version --client | grep -qF "Client Version: v1.37." || { echo "kubectl on PATH is not 1.37: $(command -v kubectl)"; exit 1; }
kubectl get nodes'
EOF
say "2/2 start, then: wait for the cluster, gpulab status, kubectl get nodes"
started=$(date +%s)
as_user ./start bash -c "$after_start" || fail "start, or the command it ran, exited with $?"
say "start's cluster came up and gpulab status passed ($(($(date +%s) - started)) s after start)"

# CPU seconds (user + system) the check's processes have used so far.
cpu_seconds() {
    local pid
    for pid in $(check_pids); do
        # Fields 14 and 15 of /proc/PID/stat; the command name before them may hold spaces.
        sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null || true
    done | awk -v hz="$(getconf CLK_TCK)" '{t += $12 + $13} END {printf "%.2f", t / hz}'
}

pids="$(check_pids | paste -sd,)"
if [ -n "$pids" ]; then
    say "memory of the cluster's processes (RSS, MiB):"
    ps -o rss=,comm= -p "$pids" | awk '{mib = $1 / 1024; sum += mib; printf "  %7.1f  %s\n", mib, $2}
        END {printf "  %7.1f  total\n", sum}'
    before="$(cpu_seconds)"
    sleep 20
    say "CPU of the idle cluster: $(awk -v a="$before" -v b="$(cpu_seconds)" 'BEGIN {printf "%.2f", (b - a) / 20}') cores (20 s average)"
fi
