"""The runtime's diagnostics from Python: the tap dump (tap_dump=, tap_dump_max_rows=, write_tap_dump) and the
self-check at open (self_check=, TFE_CHECK). Their arguments are refused by name without a GPU; the rest needs one."""

import json
import struct

import numpy as np
import pytest

import tfe

has_gpu = tfe.cuda_device_count() > 0


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    return tfe.random_head("tiny", tmp_path_factory.mktemp("heads") / "tiny.tfe", seed=13)


def read_dump(path):
    """metadata, and name -> numpy array (BF16 as uint16 bits), read as the safetensors layout states."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    metadata = header.pop("__metadata__")
    dtypes = {"BF16": np.uint16, "I32": np.int32}
    data = raw[8 + n :]
    arrays = {
        name: np.frombuffer(data[t["data_offsets"][0] : t["data_offsets"][1]], dtype=dtypes[t["dtype"]]).reshape(
            t["shape"]
        )
        for name, t in header.items()
    }
    return metadata, arrays


def test_diagnostic_arguments_refused_by_name_before_the_device(head, tmp_path, monkeypatch):
    with pytest.raises(tfe.Error, match=r"tap_dump_max_rows: 0 is outside 1\.\.2147483647"):
        tfe.Runtime(head, tap_dump=tmp_path / "t.safetensors", tap_dump_max_rows=0)
    with pytest.raises(TypeError, match="tap_dump_max_rows"):
        tfe.Runtime(head, tap_dump_max_rows="many")
    with pytest.raises(TypeError, match="tap_dump"):
        tfe.Runtime(head, tap_dump=3)
    with pytest.raises(TypeError, match="self_check"):
        tfe.Runtime(head, self_check=1)
    missing = tmp_path / "no" / "t.safetensors"
    with pytest.raises(tfe.Error, match=f"{tmp_path / 'no'} does not exist"):
        tfe.Runtime(head, tap_dump=missing)
    with pytest.raises(tfe.Error, match="is a directory"):
        tfe.Runtime(head, tap_dump=tmp_path)
    monkeypatch.setenv("TFE_TAP_DUMP", str(missing))
    with pytest.raises(tfe.Error, match="does not exist"):
        tfe.Runtime(head)
    monkeypatch.delenv("TFE_TAP_DUMP")
    monkeypatch.setenv("TFE_CHECK", "yes")
    with pytest.raises(tfe.Error, match="TFE_CHECK: `yes` is not 0 or 1"):
        tfe.Runtime(head)
    assert not missing.parent.exists()


def test_runtime_has_write_tap_dump():
    assert callable(tfe.Runtime.write_tap_dump)


@pytest.mark.skipif(not has_gpu, reason="no CUDA device")
def test_tap_dump_and_self_check(head, tmp_path):
    h = head.header
    width = len(h["taps"]) * h["target_hidden"]
    rng = np.random.default_rng(3)
    taps = (rng.standard_normal((5, width), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    tokens = rng.integers(0, h["vocab"], 5, dtype=np.int32)
    path = tmp_path / "taps.safetensors"
    opts = dict(buckets=[1, 2, 4], max_steps=4, max_slots=8, fp8="off")
    with tfe.Runtime(head, tap_dump=path, tap_dump_max_rows=4, self_check=True, **opts) as rt:
        rt.extend(0, 0, taps[:3], tokens[:3])
        rt.extend(1, 0, taps[3:], tokens[3:])  # one row past the limit
        rt.write_tap_dump()
        metadata, arrays = read_dump(path)
        assert metadata["format"] == "tfe.tap_dump" and metadata["head_sha256"] == head.header_sha256
        assert (metadata["rows"], metadata["calls"], metadata["dropped_rows"]) == ("4", "2", "1")
        assert np.array_equal(arrays["taps"], taps[:4])
        assert np.array_equal(arrays["tokens"], tokens[:4])
        assert arrays["slots"].tolist() == [0, 0, 0, 1]
        assert arrays["positions"].tolist() == [0, 1, 2, 0]
        assert arrays["calls"].tolist() == [0, 0, 0, 1]
    with tfe.Runtime(head, **opts) as rt:
        with pytest.raises(tfe.Error, match="no tap dump is on"):
            rt.write_tap_dump()
