#!/usr/bin/env python3
"""Interop of .tfe files with the `safetensors` package (numpy only, no torch).

  read_tfe.py read HEAD.tfe EXPECTED.json
      Reads every tensor of a head written by tfe and checks names, dtypes, shapes, the sha256 of each
      tensor's bytes (against EXPECTED.json and against the file's own `tfe.sha256` record) and the metadata.
      numpy has no bfloat16 or float8 type, so every tensor is read as raw bytes with
      safetensors.deserialize; those numpy can hold (F32, I32) are also read with safe_open(framework="numpy")
      and must give the same bytes.
  read_tfe.py write OUT.safetensors
      Writes a file with safetensors.numpy.save_file for tfe's reader to check (values documented below).

Exit status 0 when every check passes; 1 with a message naming the first mismatch.
"""
import hashlib
import json
import sys

import numpy as np
from safetensors import deserialize, safe_open
from safetensors.numpy import save_file

# dtypes numpy holds natively, by safetensors name.
NUMPY_DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "F16": np.float16}


def check(cond, message):
    if not cond:
        print(f"read_tfe.py: {message}", file=sys.stderr)
        sys.exit(1)


def read(path, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    with open(path, "rb") as f:
        raw = f.read()

    tensors = {name: t for name, t in deserialize(raw)}
    check(set(tensors) == set(expected["tensors"]),
          f"tensor names differ: file has {sorted(tensors)}, expected {sorted(expected['tensors'])}")
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata()
        check(metadata == expected["metadata"], f"metadata differs: {metadata}")
        check(set(f.keys()) == set(tensors), "safe_open lists other tensors than deserialize")
        recorded = json.loads(metadata["tfe.sha256"])
        numpy_read = 0
        for name, t in tensors.items():
            want = expected["tensors"][name]
            data = bytes(t["data"])
            digest = hashlib.sha256(data).hexdigest()
            check(t["dtype"] == want["dtype"], f"{name}: dtype {t['dtype']}, expected {want['dtype']}")
            check(list(t["shape"]) == want["shape"], f"{name}: shape {t['shape']}, expected {want['shape']}")
            check(digest == want["sha256"], f"{name}: sha256 {digest}, expected {want['sha256']}")
            check(recorded.get(name) == digest, f"{name}: tfe.sha256 records {recorded.get(name)}, bytes hash {digest}")
            if t["dtype"] in NUMPY_DTYPES:
                array = f.get_tensor(name)
                check(array.dtype == NUMPY_DTYPES[t["dtype"]], f"{name}: numpy dtype {array.dtype}")
                check(list(array.shape) == want["shape"], f"{name}: numpy shape {array.shape}")
                check(array.tobytes() == data, f"{name}: numpy bytes differ from the raw bytes")
                numpy_read += 1
    print(f"ok: {len(tensors)} tensors ({numpy_read} also through numpy)")


def write(path):
    # Values the C++ side recomputes: a = 0.5 * arange(12) as float32 [3, 4]; b = arange(-5, 6) as int32;
    # c = arange(6) / 4 as float16 [2, 3]; d = arange(5) * 3 - 7 as int64; e = float32 [0, 3].
    save_file(
        {
            "a": (0.5 * np.arange(12, dtype=np.float32)).reshape(3, 4),
            "b": np.arange(-5, 6, dtype=np.int32),
            "c": (np.arange(6, dtype=np.float16) / 4).reshape(2, 3),
            "d": np.arange(5, dtype=np.int64) * 3 - 7,
            "e": np.zeros((0, 3), dtype=np.float32),
        },
        path,
        metadata={"written_by": "safetensors.numpy"},
    )
    print(f"ok: wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
