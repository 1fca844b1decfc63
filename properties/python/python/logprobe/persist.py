"""Runs a one-shot fuzz adapter persistently (docs/fuzz-protocol.md).

    logprobe fuzz --exec-persistent \\
        'python -m logprobe.persist my_adapter.py --in {in} --out {out}'

``my_adapter.py`` is an unchanged one-shot adapter (the script of
``--exec 'python my_adapter.py --in {in} --out {out}'``). This process speaks
the persistent protocol on stdin/stdout (frames: a little-endian u64 length,
then a safetensors file) and, for each request, runs the script with
``runpy`` as ``python my_adapter.py ...`` would: ``sys.argv`` is the script
and its arguments with ``{in}`` / ``{out}`` replaced by the call's files,
``__name__`` is ``"__main__"``, the script's folder is first on
``sys.path``. What the script imports stays imported: torch loads once.

Per call, as the one-shot transport gives it: fresh ``{in}`` / ``{out}``
files in a temporary folder removed after the call; stdin is ``/dev/null``;
the script's stdout goes to stderr (stdout carries frames only); the working
folder and ``sys.path`` are restored; child processes the script left
running are killed. A script that exits non-zero (``sys.exit(3)``, an
uncaught exception: its traceback on stderr) or writes no ``{out}`` file
ends this process with that status (1 when none), as a one-shot process
would end: logprobe reports a finding of kind ``command`` and starts a fresh
process for the next call. End of stdin: exit 0.

Needs only the standard library (``python path/to/logprobe/persist.py ...``
works without the package installed).
"""
import io
import os
import runpy
import shutil
import signal
import struct
import sys
import tempfile
import traceback
from typing import List, Optional

USAGE = "usage: python -m logprobe.persist SCRIPT [ARGS...]  (ARGS hold {in} and {out})"


def _read_exact(f: io.RawIOBase, n: int) -> Optional[bytes]:
    """`n` bytes, or None at the end of the stream before the first byte."""
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            if not buf:
                return None
            raise EOFError(f"the stream ended inside a frame ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


def _children() -> List[int]:
    """This process's children (Linux: /proc; elsewhere none)."""
    me, kids = os.getpid(), []
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return kids
    for t in tasks:
        try:
            with open(f"/proc/{me}/task/{t}/children") as f:
                kids += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pass
    return kids


def _kill_children() -> None:
    """Kills and reaps the children the script left (one-shot: killed after
    each call); their own descendants are logprobe's to kill at the end."""
    for pid in _children():
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            pass


def _call(script: str, args: List[str], request: bytes) -> bytes:
    """Runs the script once on `request`; returns its {out} file's bytes.
    Raises SystemExit with the status this process must end with."""
    folder = tempfile.mkdtemp(prefix="logprobe-persist-")
    cwd, path = os.getcwd(), list(sys.path)
    try:
        inp = os.path.join(folder, "in.safetensors")
        out = os.path.join(folder, "out.safetensors")
        with open(inp, "wb") as f:
            f.write(request)
        sys.argv = [script] + [a.replace("{in}", inp).replace("{out}", out) for a in args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                if not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
                raise SystemExit(e.code if isinstance(e.code, int) else 1)
        except BaseException:
            traceback.print_exc()
            raise SystemExit(1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            _kill_children()
        try:
            with open(out, "rb") as f:
                return f.read()
        except OSError:
            print("logprobe.persist: the script exited 0 but wrote no {out} file", file=sys.stderr)
            raise SystemExit(1)
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Serves frames until stdin ends (see the module docs); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    script, args = argv[0], argv[1:]
    if not any("{in}" in a for a in args) or not any("{out}" in a for a in args):
        print(f"logprobe.persist: the arguments must hold {{in}} and {{out}}\n{USAGE}", file=sys.stderr)
        return 2
    if not os.path.isfile(script):
        print(f"logprobe.persist: no script {script!r}", file=sys.stderr)
        return 2
    # Frames on private copies of fd 0 and 1; the script gets /dev/null as
    # stdin and stderr as stdout, at the fd level too (its subprocesses).
    frames_in = os.fdopen(os.dup(0), "rb", buffering=0)
    frames_out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
    while True:
        try:
            head = _read_exact(frames_in, 8)
            if head is None:
                return 0
            (n,) = struct.unpack("<Q", head)
            request = _read_exact(frames_in, n)
        except EOFError as e:
            print(f"logprobe.persist: {e}", file=sys.stderr)
            return 1
        try:
            answer = _call(script, args, request or b"")
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 1
        frames_out.write(struct.pack("<Q", len(answer)) + answer)
        frames_out.flush()


if __name__ == "__main__":
    # `python -m` puts the working folder first on sys.path, `python
    # persist.py` this file's folder: `python my_adapter.py` has neither.
    sys.path.pop(0)
    sys.exit(main())
