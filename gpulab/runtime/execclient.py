"""The ``kubectl exec`` dispatcher KWOK runs: one file, standard library only.

:func:`gpulab.runtime.streaming.write_farm` copies it to ``<cluster>/exec-path/.dispatch``
(with the system ``python3`` in its first line) and links every program name
there to it. KWOK finds the program there first and runs it as itself (as
nobody when gpulab is root, from a directory the virtualenv's interpreter may
not be reachable from, hence the system interpreter and no imports of gpulab).
It sends the program's name, its arguments and its stdin, stdout and stderr
to the node agent (:class:`gpulab.runtime.streaming.ExecServer`), which runs
them in the container, and exits with the status it answers.
"""

import json
import os
import shutil
import socket
import sys

SOCKET_ENV = "GPULAB_EXEC_SOCKET"
TARGET_ENV = "GPULAB_EXEC_TARGET"
FARM = "exec-path"


def main(argv: list[str]) -> int:
    program, args = os.path.basename(argv[0]), argv[1:]
    path, target = os.environ.get(SOCKET_ENV), os.environ.get(TARGET_ENV)
    if not path or not target:
        # Not an exec KWOK serves for gpulab: the program of this name further down the PATH.
        rest = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                               if d and not d.rstrip("/").endswith(FARM))
        real = shutil.which(program, path=rest)
        if real is None:
            print(f'exec: "{program}": executable file not found in $PATH', file=sys.stderr)
            return 127
        os.execv(real, [program, *args])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps({"target": target, "argv": [program, *args]}).encode()], [0, 1, 2])
        line = conn.makefile("r").readline()
    except OSError as e:
        print(f"gpulab: cannot reach the node agent to exec in the pod: {e}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    answer = json.loads(line) if line else {"exit": 1, "error": "the node agent hung up"}
    if answer.get("error"):
        print(f"error: {answer['error']}", file=sys.stderr)
    return int(answer.get("exit", 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
