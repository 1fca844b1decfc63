"""`python -m logprobe.persist SCRIPT ARGS`: a one-shot adapter served on the
persistent protocol's frames (docs/fuzz-protocol.md). One process serves
every call; the script runs once per call with its {in} / {out} files (what
it imports stays imported); its stdout never reaches the frames; a non-zero
exit ends the process with that status; the end of stdin ends it with 0.
(The numpy example adapter runs through it in properties/tests/fuzz_exec.rs
and scripts/fuzz-exec.sh, under the `logprobe` binary.)
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

SCRIPT = r'''
import os, sys
import helper                      # imported once per process, not per call
helper.calls += 1
print("noise on the script's stdout")
src = sys.argv[sys.argv.index("--in") + 1]
dst = sys.argv[sys.argv.index("--out") + 1]
assert sys.stdin.read() == ""      # stdin is /dev/null, as one-shot
data = open(src, "rb").read()
if data == b"exit 3":
    sys.exit(3)
if data == b"raise":
    raise RuntimeError("a bug in the adapter")
if data == b"no out":
    sys.exit(0)
with open(dst, "wb") as f:
    f.write(b"%s|%d|%d|%s" % (data[::-1], helper.calls, os.getpid(), src.encode()))
'''


def _start(tmp_path):
    (tmp_path / "helper.py").write_text("calls = 0\n")
    (tmp_path / "adapter.py").write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, "-m", "logprobe.persist", str(tmp_path / "adapter.py"),
         "--in", "{in}", "--out", "{out}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=str(tmp_path.parent),      # the script's folder comes from its path
    )


def _call(p, payload: bytes) -> bytes:
    p.stdin.write(struct.pack("<Q", len(payload)) + payload)
    p.stdin.flush()
    (n,) = struct.unpack("<Q", p.stdout.read(8))
    return p.stdout.read(n)


def test_one_process_serves_every_call_and_imports_once(tmp_path):
    p = _start(tmp_path)
    pids = set()
    for i in range(1, 4):
        body, calls, pid, src = _call(p, b"request %d" % i).split(b"|")
        assert body == (b"request %d" % i)[::-1]
        assert int(calls) == i          # the script ran again; helper stayed imported
        pids.add(int(pid))
        assert not os.path.exists(os.path.dirname(src))   # the call's folder is gone
    assert pids == {p.pid}
    p.stdin.close()
    assert p.wait(timeout=30) == 0
    err = p.stderr.read().decode()
    assert err.count("noise on the script's stdout") == 3   # stdout went to stderr


def test_a_failing_script_ends_the_process_with_its_status(tmp_path):
    for payload, status, said in [
        (b"exit 3", 3, ""),
        (b"raise", 1, "RuntimeError: a bug in the adapter"),
        (b"no out", 1, "wrote no {out} file"),
    ]:
        p = _start(tmp_path)
        assert _call(p, b"fine").startswith(b"enif|1|")
        p.stdin.write(struct.pack("<Q", len(payload)) + payload)
        p.stdin.flush()
        assert p.stdout.read() == b""   # no answer frame
        assert p.wait(timeout=30) == status
        assert said in p.stderr.read().decode()


def test_bad_usage_exits_2(tmp_path):
    for args in [[], ["missing.py", "{in}", "{out}"], [str(tmp_path / "x.py"), "--in", "{in}"]]:
        (tmp_path / "x.py").write_text("")
        r = subprocess.run([sys.executable, "-m", "logprobe.persist", *args],
                           capture_output=True, stdin=subprocess.DEVNULL)
        assert r.returncode == 2, r
        assert r.stdout == b""
