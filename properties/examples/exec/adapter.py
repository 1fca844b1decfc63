#!/usr/bin/env python3
"""logprobe fuzz protocol v1 adapter (docs/fuzz-protocol.md): the file to copy.

One-shot:    logprobe fuzz --exec 'python3 adapter.py --in {in} --out {out}'
Persistent:  logprobe fuzz --exec-persistent 'python3 adapter.py --persistent'

Replace `load_kernel` with your own: `kernel(inputs, meta) -> outputs`, where
`inputs` maps tensor names to numpy arrays (BF16 arrives as float32, exactly,
with meta["logits_dtype"] = "bf16"), `meta` maps metadata keys to strings, and
`outputs` maps every name of meta["outputs"] to a float array (f64, f32, f16).
Needs numpy only.
"""
import argparse, json, struct, sys
import numpy as np

READ = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
        "I32": "<i4", "U32": "<u4", "U8": "u1", "BOOL": "?"}
WRITE = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def read_dump(b):
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n])
    meta = dict(header.pop("__metadata__", None) or {})
    tensors = {}
    for name, t in header.items():
        s, e = t["data_offsets"]
        a = np.frombuffer(b[8 + n + s:8 + n + e], dtype=READ[t["dtype"]]).reshape(t["shape"])
        if t["dtype"] == "BF16":  # bf16 -> f32 is exact: the high half of the bits
            a = (a.astype(np.uint32) << 16).view(np.float32)
        if name == "logits":
            meta["logits_dtype"] = t["dtype"].lower()
        tensors[name] = a
    return tensors, meta


def write_dump(tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        data = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": WRITE[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def load_kernel(args):
    if args.kernel == "torch":
        from kernel_torch import make_kernel
    else:
        from kernel_numpy import make_kernel
    return make_kernel(args.bug)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp")
    ap.add_argument("--out")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--kernel", default="numpy", choices=["numpy", "torch"])
    ap.add_argument("--bug", default="none")
    args = ap.parse_args()
    kernel = load_kernel(args)
    if not args.persistent:
        with open(args.inp, "rb") as f:
            out = write_dump(kernel(*read_dump(f.read())))
        with open(args.out, "wb") as f:
            f.write(out)
        return
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries frames only: print() goes to stderr
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return  # stdin closed: the search is over
        (n,) = struct.unpack("<Q", head)
        out = write_dump(kernel(*read_dump(stdin.read(n))))
        stdout.write(struct.pack("<Q", len(out)) + out)
        stdout.flush()


if __name__ == "__main__":
    main()
