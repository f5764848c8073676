"""A demo corpus built from the Python interpreter's own documentation, so nothing is downloaded.

Documents are the pydoc topics (``pydoc_data.topics``: the language reference behind
``help("if")``) and the docstrings of the standard library's modules, read with ``ast`` from
the source files without importing them. The text is written once in google-research/bert's
format (one sentence per line, a blank line between documents) into a cache directory and
reused on later calls. The output depends only on the interpreter's version.
"""

from __future__ import annotations

import ast
import io
import os
import pathlib
import pydoc_data.topics
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterator

from bertjax.data.sentences import split_sentences
from bertjax.storage import fs

# Bump when the extraction below changes, so that old caches are not reused.
FORMAT_VERSION = 2
# Standard-library directories that hold tests, GUI demos or vendored wheels, not prose.
_SKIP_DIRS = frozenset(
    """
    test tests idle_test idlelib tkinter turtledemo lib2to3 ensurepip site-packages
    dist-packages __pycache__ __phello__ encodings pydoc_data
    """.split()
)
_RULE_LINE = re.compile(r"^\s*([=\-~*^\"#+`'.:_])\1{2,}\s*$")  # reST underlines: "=====", "****"
_HAS_LETTER = re.compile(r"[^\W\d_]")
# Longer "sentences" in the docs are tables and option lists run together, not prose.
_MAX_SENTENCE_CHARS = 1000


def _prose_sentences(text: str) -> list[str]:
    """Sentences of the prose paragraphs of a docstring or topic (code blocks dropped)."""
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if not _RULE_LINE.match(line)]
        if not lines:
            continue
        # Indented paragraphs and interactive sessions are code samples, not sentences.
        if lines[0][:1].isspace() or any(line.lstrip().startswith(">>>") for line in lines):
            continue
        for sentence in split_sentences("\n".join(lines)):
            if 1 < len(sentence) <= _MAX_SENTENCE_CHARS and _HAS_LETTER.search(sentence):
                sentences.append(sentence)
    return sentences


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of a module and of its classes and functions, in source order."""
    docstring = ast.get_docstring(tree, clean=True)  # type: ignore[arg-type]
    if docstring:
        yield docstring
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _docstrings(node)


def _stdlib_sources() -> list[pathlib.Path]:
    """The standard library's .py files, sorted, without tests and demos."""
    root = sysconfig.get_paths()["stdlib"]
    sources = []
    for directory, subdirs, files in os.walk(root):
        # Prune in place so that site-packages and test trees are never walked.
        subdirs[:] = [d for d in subdirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        sources.extend(
            pathlib.Path(directory, f)
            for f in files
            if f.endswith(".py") and not f.startswith("test_")
        )
    return sorted(sources, key=lambda p: p.relative_to(root).as_posix())


def demo_documents() -> Iterator[list[str]]:
    """The demo corpus's documents: pydoc topics, then standard-library modules."""
    for name in sorted(pydoc_data.topics.topics):
        sentences = _prose_sentences(pydoc_data.topics.topics[name])
        if sentences:
            yield sentences
    for path in _stdlib_sources():
        try:
            source = path.read_text(encoding="utf-8")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences in old modules
                tree = ast.parse(source, filename=str(path))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue  # a file this interpreter cannot parse contributes nothing
        sentences = [s for doc in _docstrings(tree) for s in _prose_sentences(doc)]
        if sentences:
            yield sentences


def demo_corpus_path(cache_dir: str | os.PathLike) -> fs.AnyPath:
    """Writes the demo corpus into cache_dir (local or gs://) once and returns its path."""
    cache_dir = fs.path(cache_dir)
    version = ".".join(str(v) for v in sys.version_info[:3])
    path = cache_dir / f"demo_corpus-v{FORMAT_VERSION}-python{version}.txt"
    if fs.is_file(path) and fs.size(path) > 0:
        return path
    # Written whole (a few MB), atomically: a crash never leaves half a corpus behind.
    text = io.StringIO()
    for i, document in enumerate(demo_documents()):
        if i:
            text.write("\n")
        text.write("\n".join(document))
        text.write("\n")
    fs.write_text(path, text.getvalue())
    return path
