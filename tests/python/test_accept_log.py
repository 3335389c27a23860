"""The accept log from Python (tfe.AcceptLog, on the CPU) and tfe-accept-table over its lines."""

import json
import subprocess
import sys

import pytest

import tfe
from tfe import accept_table


def lines(path):
    return [json.loads(t) for t in path.read_text().splitlines()]


def test_accept_log_counts_and_lines(tmp_path):
    path = tmp_path / "accept.jsonl"
    with tfe.AcceptLog(every=2, path=path, label="code") as log:
        log.record([0, 2, 3], 3)
        assert not path.exists() or path.read_text() == ""
        log.record([1], 3)
        t = log.totals()
        assert t["asked"] == [4, 3, 2] and t["kept"] == [3, 2, 1]
        assert t["rounds"] == 2 and t["sequences"] == 4 and t["mean_kept"] == pytest.approx(1.5)
        log.record([3], 3)  # left for close
    got = lines(path)
    assert [g["round"] for g in got] == [2, 3]
    assert got[0]["label"] == "code" and got[0]["tokens_per_round"] == pytest.approx(2.5)
    assert [w["asked"] for w in got[0]["window"]] == [4, 3, 2]


def test_accept_log_refuses_bad_rounds(tmp_path):
    log = tfe.AcceptLog()
    with pytest.raises(tfe.Error, match=r"kept\[1\] = 5 is outside 0..4"):
        log.record([0, 5], 4)
    with pytest.raises(tfe.Error, match="steps 0"):
        log.record([0], 0)
    assert log.totals()["rounds"] == 0
    missing = tmp_path / "no" / "such" / "dir.jsonl"
    with pytest.raises(tfe.Error, match=str(missing)):
        tfe.AcceptLog(every=1, path=missing)


def test_accept_table(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with tfe.AcceptLog(every=1, path=a, label="chat") as log:
        log.record([2, 0], 2)
    with tfe.AcceptLog(every=1, path=b, label="chat") as log:
        log.record([1], 2)
    with tfe.AcceptLog(every=1, path=b, label="math") as log:
        log.record([2], 2)
    counts = accept_table.read_logs([str(a), str(b)])
    assert list(counts) == ["chat", "math"]
    chat = counts["chat"]
    assert chat.asked == [3, 2] and chat.kept == [2, 1] and chat.rounds == 2 and chat.sequences == 3
    assert chat.tokens_per_round == pytest.approx(2.0)
    assert accept_table.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "chat" in out and "math" in out and "0.667" in out and "3.000" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert accept_table.main([str(bad)]) == 1
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_accept_table_help():
    r = subprocess.run([sys.executable, "-m", "tfe.accept_table", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--plot" in r.stdout


def test_accept_table_plot(tmp_path):
    pytest.importorskip("matplotlib")
    log = tmp_path / "a.jsonl"
    with tfe.AcceptLog(every=1, path=log, label="chat") as al:
        al.record([2, 1], 3)
    png = tmp_path / "accept.png"
    assert accept_table.main([str(log), "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
