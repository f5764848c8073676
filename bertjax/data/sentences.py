"""A small, fast rule-based sentence splitter for English-like and CJK text.

Rules: a sentence ends at . ! ? (followed by whitespace) or at the CJK 。！？ (no whitespace
needed), including any closing quotes or brackets right after the terminator. . ! ? do not end
a sentence when the next word starts with a lower-case letter, and a single "." does not end
one after a common abbreviation ("Mr.", "e.g.") or a single-letter initial ("J. Smith").
Blank lines always end a sentence; a single line break inside a paragraph is whitespace.
"""

from __future__ import annotations

import re

_CLOSERS = "\"'\u201d\u2019)\\]}\u300d\u300f\u300b\u3009\u3011\uff09\u00bb"
# A terminator run plus closers; ASCII terminators only count when whitespace follows.
_BOUNDARY = re.compile(rf"(?:[.!?\u2026]+[{_CLOSERS}]*(?=\s)|[\u3002\uff01\uff1f]+[{_CLOSERS}]*)")
_PARAGRAPH = re.compile(r"\n\s*\n")
_OPENERS = "\"'\u201c\u2018([{\u300c\u300e\u300a"

# Lower-cased words (without the final ".") after which "." rarely ends a sentence.
ABBREVIATIONS = frozenset(
    """
    mr mrs ms dr prof sr jr st mt vs cf eg ie al fig figs eq eqs no nos vol vols pp ed eds
    approx dept est gen gov lt col sgt capt cmdr rev hon jan feb mar apr jun jul aug sep sept
    oct nov dec ca resp viz inc ltd co corp
    """.split()
)


def _ends_with_abbreviation(text: str, end: int) -> bool:
    """Whether the word that ends at text[end] (just before a ".") is an abbreviation."""
    start = max(text.rfind(" ", 0, end), text.rfind("\n", 0, end)) + 1
    word = text[start:end].lstrip(_OPENERS)
    if not word:
        return False
    if len(word) == 1 and word.isalpha():
        return True  # an initial: "J. R. R. Tolkien"
    if "." in word:
        return True  # "e.g", "U.S", "i.e"
    return word.lower() in ABBREVIATIONS


def _split_paragraph(text: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end()
        terminator = match.group(0).rstrip(_CLOSERS)
        if terminator[-1] in ".!?\u2026":
            if terminator == "." and _ends_with_abbreviation(text, match.start()):
                continue
            # English sentences do not start in lower case: "approx. five", "(really?) no".
            if text[end : end + 8].lstrip()[:1].islower():
                continue
        sentence = " ".join(text[start:end].split())
        if sentence:
            sentences.append(sentence)
        start = end
    rest = " ".join(text[start:].split())
    if rest:
        sentences.append(rest)
    return sentences


def split_sentences(text: str) -> list[str]:
    """Splits text into sentences (whitespace inside each sentence collapsed to one space)."""
    sentences: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        sentences.extend(_split_paragraph(paragraph))
    return sentences
