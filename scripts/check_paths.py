"""Checks that every repository path cited in the tree exists: in comments, docs and scripts alike.

The files read are those git tracks or would track (not ignored). A citation is a word that starts with
one of the repository's top-level folders and a slash (`kernels/weight_layout.h`, `head/numerics`,
`tests/golden`); one written after another path's slash or a variable (`build/python/tfe`,
`$PWD/scripts`) is not read as one. It exists when such a file or folder has that path, when a file has
it as its name without the extension (`examples/draft_loop`, the program of `examples/draft_loop.cpp`),
or, for a pattern (`tests/fuzz/fuzz_*.cpp`, `head/header_{json,yaml}.cpp`), when every brace alternative
matches a file. Templates are not checked: a word followed by `<` or `$` (`tools/cmd_<name>.cpp`,
`tests/fuzz/corpus/$target`), and the placeholder NAME (`kernels/NAME.h`).

Prints each missing citation as FILE:LINE: PATH and exits 1 when there is one.
Usage: python3 scripts/check_paths.py"""
import fnmatch
import pathlib
import re
import subprocess
import sys


def brace_expand(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in brace_expand(path[: m.start()] + alt + path[m.end() :])]


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True).stdout.split("\n")
    files = [f for f in files if f]
    folders = {str(pathlib.PurePosixPath(f).parents[i]) for f in files for i in range(f.count("/"))}
    stems = {f.rsplit(".", 1)[0] for f in files if "." in f.rsplit("/", 1)[-1]}
    tops = sorted({f.split("/", 1)[0] for f in files if "/" in f})
    cite = re.compile(r"(?<![\w./$-])((?:%s)/[\w./*{},-]*)(.?)" % "|".join(map(re.escape, tops)))

    def exists(path):
        path = path.rstrip("/")
        if path in folders or path in stems:
            return True
        if not any(c in path for c in "*?["):
            return path in files
        return any(fnmatch.fnmatchcase(f, path) or fnmatch.fnmatchcase(f, path + "/*") for f in files)

    missing = 0
    for name in files:
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in cite.finditer(line):
                path, after = m.group(1).rstrip(".,"), m.group(2)
                if after in ("<", "$") or "NAME" in path:
                    continue
                if not all(exists(p) for p in brace_expand(path)):
                    print(f"{name}:{number}: {path} is not in the repository")
                    missing += 1
    if missing:
        print(f"check_paths: {missing} cited paths do not exist; correct the citation or the path", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
