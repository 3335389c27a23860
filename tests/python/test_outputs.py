"""tfe.outputs, the output rule of the Python commands: a file is written to a temporary beside it and renamed,
a failed write leaves what was there, and a path that is not a regular file is refused by kind. (The commands'
own `-o` refusals are tested in tests/target/test_outputs.py.)"""

import os
import re
import stat

import pytest

from tfe.outputs import check_output_dir, check_output_file, replacing, write_atomic


def new_file_mode():
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("an older, longer report\n")
    write_atomic(path, '{"passed": true}\n')
    assert path.read_text() == '{"passed": true}\n'
    assert stat.S_IMODE(os.stat(path).st_mode) == new_file_mode()
    write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["report.json"]


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="the writer failed"):
        with replacing(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("the writer failed")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["plot.png"]


def test_a_symlink_is_replaced_not_followed(tmp_path):
    kept = tmp_path / "kept.txt"
    kept.write_text("someone else's\n")
    link = tmp_path / "out.json"
    os.symlink(kept, link)
    write_atomic(link, "{}\n")
    assert not link.is_symlink() and link.read_text() == "{}\n"
    assert kept.read_text() == "someone else's\n"


def test_what_appears_at_the_path_meanwhile_is_not_replaced(tmp_path):
    """A FIFO or folder put at the path while the writer runs is refused at the rename, and stays."""
    for make, kind in ((os.mkfifo, "a FIFO"), (os.mkdir, "a directory")):
        path = tmp_path / f"out-{kind[2:]}"
        with pytest.raises(ValueError, match=f"is {kind}; the output was not written"):
            with replacing(path) as tmp:
                tmp.write_text("x")
                make(path)
        assert os.path.lexists(path) and not os.path.isfile(path)
    assert sorted(os.listdir(tmp_path)) == ["out-FIFO", "out-directory"]


def test_check_output_file_and_dir_refuse_by_kind(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_output_file(plain, "-o")
    check_output_file(tmp_path / "new.json", "-o")
    for path, message in [
        (tmp_path, "is a directory"),
        (fifo, "is a FIFO"),
        (plain / "x.json", "is not a directory"),
        ("", "names no file"),
        ("a\0b", "holds a NUL byte"),
    ]:
        with pytest.raises(ValueError, match=f"^-o.*{message}"):
            check_output_file(path, "-o")
    with pytest.raises(ValueError, match="is the command's input"):
        check_output_file(plain, "-o", inputs=[tmp_path / "none", plain])
    check_output_dir(tmp_path, "--out", files=["plain"])
    check_output_dir(tmp_path / "a" / "b", "--out")
    for path, files, message in [
        (plain, (), "is a regular file; name a directory"),
        (fifo, (), "is a FIFO"),
        (plain / "sub", (), f"{re.escape(str(plain))} is a regular file, not a directory"),
        (tmp_path, ["fifo"], "fifo in it is a FIFO"),
    ]:
        with pytest.raises(ValueError, match=f"^--out {re.escape(str(path))}: .*{message}"):
            check_output_dir(path, "--out", files=files)
    with pytest.raises(ValueError, match="plain in it is the command's input"):
        check_output_dir(tmp_path, "--out", files=["plain"], inputs=[plain])
