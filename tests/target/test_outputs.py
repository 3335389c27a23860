"""The real-target commands' outputs follow the output rule (tfe.outputs): a `-o` folder (tfe-train-head,
tfe-speedup) or file (tfe-check-exact, tfe-tensor-parallel) that is a device, FIFO, socket, the wrong kind of
file or one of the command's inputs is refused with one line naming the argument, before the target loads
and before anything is made; a good one passes on to the load. No model is loaded: needs torch only."""

import importlib
import os
import socket
import stat

import pytest

torch = pytest.importorskip("torch", reason="the target extra is not installed (missing: torch)")

FOLDER_COMMANDS = {  # module: the files it writes into --out
    "train_head": ("config.json", "model.safetensors", "training.json", "training.png"),
    "speedup": ("speedup.json", "speedup.png", "split.png", "acceptance.json", "windows.json"),
}


class Loaded(Exception):
    """Raised in place of loading the target: the arguments passed their checks."""


def loaded(*args, **kwargs):
    raise Loaded()


def run(command, argv, monkeypatch):
    """module.main(argv) with the target's load (and tfe-tensor-parallel's start of the ranks, which comes
    first) stubbed; returns the SystemExit or Loaded it ends with."""
    module = importlib.import_module(f"tfe.{command}")
    monkeypatch.setattr(module, "load_target", loaded)
    if command == "tensor_parallel":
        monkeypatch.setattr(module, "init_ranks", loaded)
    with pytest.raises((SystemExit, Loaded)) as ended:
        module.main(argv)
    return ended.value


def argv_of(command, head, out):
    return ["-o", str(out)] + ([] if command == "train_head" else ["--head", str(head)])


@pytest.fixture
def head(tmp_path):
    """A head file (the commands read its taps before the target loads)."""
    import tfe

    path = tmp_path / "head.tfe"
    tfe.random_head("tiny", path, seed=1)
    return path


def refused(command, argv, monkeypatch, capsys):
    """The one stderr line a refusal ends with (exit 2)."""
    ended = run(command, argv, monkeypatch)
    assert isinstance(ended, SystemExit), "the target was loaded: the output was not refused"
    assert ended.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: --out " in err[-1], err
    return err[-1]


@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_output_folder_of_the_wrong_kind_is_refused_first(command, head, tmp_path, monkeypatch, capsys):
    """A regular file, FIFO, socket, device or dangling link as --out, or a path under a file: refused by kind,
    before the target loads; the thing named is left as it was and no folder is made."""
    monkeypatch.chdir(tmp_path)  # a socket's path must be short
    plain = tmp_path / "plain.txt"
    plain.write_text("keep\n")
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind("sock")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    cases = [
        (plain, "is a regular file; name a directory"),
        (tmp_path / "fifo", "is a FIFO; name a directory"),
        (tmp_path / "sock", "is a socket; name a directory"),
        (tmp_path / "dangling", "is a symlink to nothing"),
        (f"{plain}/", "is a regular file; name a directory"),
        (plain / "new", f"{plain} is a regular file, not a directory"),
    ]
    if os.path.exists("/dev/null"):
        cases.append(("/dev/null", "is a character device; name a directory"))
    try:
        for out, message in cases:
            line = refused(command, argv_of(command, head, out), monkeypatch, capsys)
            assert f"--out {out}: " in line and message in line, line
    finally:
        sock.close()
    assert plain.read_text() == "keep\n"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert stat.S_ISSOCK(os.lstat(tmp_path / "sock").st_mode)
    assert os.path.islink(tmp_path / "dangling") and not (tmp_path / "nowhere").exists()
    assert not (plain.parent / "new").exists()


@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_output_folder_holding_what_cannot_be_replaced_is_refused_first(command, head, tmp_path, monkeypatch, capsys):
    """Each file the command writes into --out: a FIFO or a folder of that name, or the command's input under
    that name, is refused before any work (a FIFO would hang the write; a hard link to an input would destroy
    it)."""
    for name in FOLDER_COMMANDS[command]:
        for kind in ("fifo", "directory"):
            out = tmp_path / f"{kind}-{name}"
            out.mkdir()
            (os.mkfifo if kind == "fifo" else os.mkdir)(out / name)
            line = refused(command, argv_of(command, head, out), monkeypatch, capsys)
            expected = "a FIFO" if kind == "fifo" else "a directory"
            assert f"--out {out}: {name} in it is {expected}, which the command would replace" in line, line
            assert os.listdir(out) == [name]
    if command == "speedup":  # its --head is an input; a hard link makes it a file in --out
        out = tmp_path / "linked"
        out.mkdir()
        os.link(head, out / "speedup.json")
        line = refused(command, argv_of(command, head, out), monkeypatch, capsys)
        assert f"speedup.json in it is the command's input {head} (the same file)" in line, line


@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_good_output_folders_pass_on_to_the_load(command, head, tmp_path, monkeypatch):
    """A new name (with or without a trailing slash, under folders yet to be made), an existing folder with
    earlier outputs in it and a link to a folder all pass the checks."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in FOLDER_COMMANDS[command]:
        (earlier / name).write_text("an earlier run's\n")
    os.symlink(earlier, tmp_path / "link")
    for out in (tmp_path / "new", f"{tmp_path}/a/b/", earlier, tmp_path / "link"):
        ended = run(command, argv_of(command, head, out), monkeypatch)
        assert isinstance(ended, Loaded), f"--out {out} was refused: exit {getattr(ended, 'code', None)}"


@pytest.mark.parametrize("command", ["exactness", "tensor_parallel"])
def test_output_file_of_the_wrong_kind_is_refused_first(command, head, tmp_path, monkeypatch, capsys):
    """The report commands' -o is a file: a folder, FIFO, device, a path ending in '/' or the --head itself is
    refused before the target loads; a new name or an existing report passes."""
    os.mkfifo(tmp_path / "fifo")
    cases = [
        (tmp_path, "is a directory; name a regular file"),
        (tmp_path / "fifo", "is a FIFO; name a regular file"),
        (f"{tmp_path}/report/", "ends in '/'"),
        (tmp_path / "missing" / "report.json", "does not exist"),
        (head, f"is the command's input {head}"),
    ]
    if os.path.exists("/dev/null"):
        cases.append(("/dev/null", "is a character device"))
    for out, message in cases:
        ended = run(command, ["--head", str(head), "-o", str(out)], monkeypatch)
        assert isinstance(ended, SystemExit) and ended.code == 2, f"-o {out} was not refused"
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"--out {out}: " in line and message in line, line
    (tmp_path / "old.json").write_text("{}")
    for out in (tmp_path / "report.json", tmp_path / "old.json"):
        assert isinstance(run(command, ["--head", str(head), "-o", str(out)], monkeypatch), Loaded)


@pytest.mark.parametrize("command", ["exactness", "speedup", "tensor_parallel"])
def test_a_head_that_is_not_a_head_file_is_refused_before_the_load(command, tmp_path, monkeypatch, capsys):
    """The commands load the target with the layers --head reads: a file that is not a head is refused with
    one line naming --head, before the target loads."""
    bad = tmp_path / "bad.tfe"
    bad.write_bytes(b"")
    out = tmp_path / ("out" if command == "speedup" else "report.json")
    ended = run(command, ["--head", str(bad), "-o", str(out)], monkeypatch)
    assert isinstance(ended, SystemExit) and ended.code == 2, "the target was loaded"
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--head {bad}: its taps cannot be read" in line, line
