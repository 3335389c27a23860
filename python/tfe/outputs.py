"""The output rule of the Python commands, as `tfe-plan` follows it (core/files.h): an output is a regular file
or a new name, never a directory, device, FIFO or socket, never one of the command's inputs (the same file
under any name), and it is written to a temporary file beside it and renamed, so a failed or interrupted
write leaves what was there. A command that writes into a folder (`-o DIR`) checks the folder and each file
it will write there before any work, with `check_output_dir`."""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
import tempfile
from typing import Iterable, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _stat(path: str) -> os.stat_result | None:
    """The file at `path`, a symlink followed; None where nothing is there (a dangling link counts as nothing:
    it is replaced, not followed)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _same_input(st: os.stat_result, inputs: Iterable[PathLike]) -> str | None:
    for given in inputs:
        if not given:
            continue
        other = _stat(os.fspath(given))
        if other is not None and (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
            return os.fspath(given)
    return None


def check_output_dir(
    path: PathLike, what: str, *, files: Iterable[str] = (), inputs: Iterable[PathLike] = ()
) -> None:
    """Raises ValueError, naming `what` (the argument, e.g. "--out") and `path`, unless `path` is an existing
    directory this process can write into, or a new name whose nearest existing parent is one (the folder is
    made with its parents). Each of `files`, the names the command writes into the folder, must be a regular
    file (replaced whole) or absent, and not one of `inputs`."""
    text = os.fspath(path)
    if not text:
        raise ValueError(f"{what}: names no directory")
    if "\0" in text:
        raise ValueError(f"{what} {text!r}: holds a NUL byte")
    folder = text.rstrip("/") or "/"  # a trailing slash names the same folder (and no file)
    try:
        st = _stat(folder)
        if st is None:
            if os.path.islink(folder):
                raise ValueError(f"{what} {text}: is a symlink to nothing; name a directory (new or existing)")
            # A new folder: the nearest part of the path that exists must be a directory we may write into.
            parent = pathlib.Path(os.path.abspath(folder)).parent
            while (pst := _stat(str(parent))) is None:
                parent = parent.parent
    except OSError as e:
        raise ValueError(f"{what} {text}: cannot stat: {e.strerror}") from None
    if st is None:
        if not stat.S_ISDIR(pst.st_mode):
            raise ValueError(f"{what} {text}: {parent} is {_kind(pst.st_mode)}, not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{what} {text}: cannot create it: {parent} is not writable")
        return
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} {text}: is {_kind(st.st_mode)}; name a directory (new or existing)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {text}: the directory is not writable")
    for name in files:
        inside = os.path.join(folder, name)
        try:
            fst = _stat(inside)
        except OSError as e:
            raise ValueError(f"{what} {text}: cannot stat {name} in it: {e.strerror}") from None
        if fst is None:
            continue
        if not stat.S_ISREG(fst.st_mode):
            raise ValueError(
                f"{what} {text}: {name} in it is {_kind(fst.st_mode)}, which the command would replace with its "
                "output; remove it or name another directory"
            )
        same = _same_input(fst, inputs)
        if same is not None:
            raise ValueError(f"{what} {text}: {name} in it is the command's input {same} (the same file); name another directory")


def check_output_file(path: PathLike, what: str, *, inputs: Iterable[PathLike] = ()) -> None:
    """Raises ValueError, naming `what` and `path`, unless `path` is a regular file that is none of `inputs`
    (it is replaced whole) or a new name in an existing directory this process can write into."""
    text = os.fspath(path)
    if not text:
        raise ValueError(f"{what}: names no file")
    if "\0" in text:
        raise ValueError(f"{what} {text!r}: holds a NUL byte")
    if text.endswith("/"):
        raise ValueError(f"{what} {text}: ends in '/', a directory; name a file to write")
    try:
        st = _stat(text)
    except OSError as e:
        raise ValueError(f"{what} {text}: cannot stat: {e.strerror}") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {text}: is {_kind(st.st_mode)}; name a regular file or a new name (it would be replaced)")
        same = _same_input(st, inputs)
        if same is not None:
            raise ValueError(f"{what} {text}: is the command's input {same} (the same file); write to another name")
        return
    folder = os.path.dirname(text) or "."
    try:
        dst = _stat(folder)
    except OSError as e:
        raise ValueError(f"{what} {text}: cannot stat {folder}: {e.strerror}") from None
    if dst is None:
        raise ValueError(f"{what} {text}: directory {folder} does not exist")
    if not stat.S_ISDIR(dst.st_mode):
        raise ValueError(f"{what} {text}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {text}: cannot write into {folder}")


def _new_file_mode() -> int:
    """The mode a new file gets here: 0666 less the umask (tempfile makes 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def replacing(path: PathLike) -> Iterator[pathlib.Path]:
    """A temporary file beside `path` (created exclusively, so a name planted there is never written) for a
    writer that takes a file name (savefig, safetensors' save_file). When the block ends without an error it
    is synced, given a new file's mode and renamed over `path`; otherwise it is removed and `path` is left as
    it was. A symlink at `path` is replaced, never followed."""
    target = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    try:
        yield pathlib.Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _new_file_mode())
        st = _stat(str(target))
        # Checked again: something other than a file put at `path` meanwhile is refused, not replaced.
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{target}: is {_kind(st.st_mode)}; the output was not written")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomic(path: PathLike, data: str | bytes) -> None:
    """Writes `data` (text as UTF-8) to `path` under the rule above: a temporary file, then a rename."""
    raw = data.encode() if isinstance(data, str) else data
    with replacing(path) as tmp:
        tmp.write_bytes(raw)
