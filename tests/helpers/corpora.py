"""A small corpus with structure a tiny BERT can learn within a few hundred steps, and the
fine-tuning tasks made from it.

Each document has a topic and is a random sequence of that topic's few fixed sentences, so
a masked word is predictable from its neighbours, and a "random next" segment (from another
document, usually of another topic) is distinguishable from the true continuation.
"""

import pathlib

import ml_collections
import numpy as np

from configs import finetune as finetune_recipe


def write_corpus(
    path: pathlib.Path,
    num_documents: int = 200,
    sentences_per_document: int = 12,
    num_topics: int = 8,
    sentences_per_topic: int = 6,
    seed: int = 0,
) -> pathlib.Path:
    """Writes google-research/bert's format (a sentence per line, blank line between documents)."""
    rng = np.random.default_rng(seed)
    topics = []
    for _ in range(num_topics):
        words = [_pseudo_word(rng) for _ in range(10)]
        topics.append(
            [
                " ".join(rng.choice(words, size=int(rng.integers(5, 9)))) + "."
                for _ in range(sentences_per_topic)
            ]
        )
    lines = []
    for doc in range(num_documents):
        sentences = topics[doc % num_topics]
        lines += [
            sentences[i] for i in rng.integers(0, len(sentences), size=sentences_per_document)
        ]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_random_corpus(
    path: pathlib.Path,
    num_documents: int = 200,
    seed: int = 0,
    *,
    vocabulary: int = 500,
    letters: str = "abcdefghijklmnopqrstuvwxyz",
    word_length: int | tuple[int, int] = (2, 10),
    sentences: tuple[int, int] = (2, 9),
    words: tuple[int, int] = (4, 18),
    prefix: str = "",
    tag_documents: bool = False,
) -> pathlib.Path:
    """Writes google-research/bert's format from a random vocabulary of `vocabulary` words
    (`prefix` + `word_length` letters, or a length drawn from that range): each document
    holds a number of sentences drawn from `sentences`, each of a number of words drawn from
    `words` (ranges half-open). With `tag_documents`, every sentence of document d starts
    with "q<d>q", so that a test can tell which document a row came from."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list(letters))
    if isinstance(word_length, int):
        vocab = [
            prefix + "".join(rng.choice(alphabet, size=word_length)) for _ in range(vocabulary)
        ]
    else:
        vocab = [
            prefix + "".join(rng.choice(alphabet, size=rng.integers(*word_length)))
            for _ in range(vocabulary)
        ]
    lines = []
    for d in range(num_documents):
        for _ in range(rng.integers(*sentences)):
            body = " ".join(rng.choice(vocab, size=rng.integers(*words)))
            lines.append(f"q{d}q {body}." if tag_documents else f"{body}.")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _pseudo_word(rng: np.random.Generator) -> str:
    """A pronounceable made-up word: varied enough for a few hundred sentencepiece pieces."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    return "".join(
        rng.choice(list(consonants)) + rng.choice(list(vowels))
        for _ in range(int(rng.integers(2, 4)))
    )


# ----------------------------------------------------------------------------- synthetic tasks

# A model smaller than configs/tiny.py's, for tests about the loop, the step, checkpoints or a
# recipe's schedules rather than what a model learns: one layer traces and compiles in about
# half the time of tiny's two.
ONE_LAYER = {"model.num_layers": 1, "model.hidden_size": 64, "model.intermediate_size": 256}

LABELS = ("politics", "sports")  # sentences of even topics, of odd topics


def topic_words(corpus: pathlib.Path) -> dict[int, list[str]]:
    """Each topic's words in a corpus that write_corpus wrote: document d is about topic d % 8."""
    words: dict[int, set[str]] = {}
    for d, document in enumerate(corpus.read_text().split("\n\n")):
        words.setdefault(d % 8, set()).update(document.replace(".", "").split())
    return {t: sorted(w) for t, w in words.items()}


def sentences(topics, count: int, seed: int, choose=range(4)):
    """(topic, words) pairs: 4 to 7 words of one topic each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        topic = int(rng.choice(list(choose)))
        out.append((topic, list(rng.choice(topics[topic], size=int(rng.integers(4, 8))))))
    return out


def write_topic_csv(path: pathlib.Path, topics, count: int, seed: int) -> pathlib.Path:
    """A classification csv: sentences of topics 0-3, labelled by the topic's parity."""
    rows = [f"{' '.join(w)},{LABELS[t % 2]}" for t, w in sentences(topics, count, seed)]
    path.write_text("sentence,label\n" + "\n".join(rows) + "\n")
    return path


def topic_task(directory: pathlib.Path, topics, train: int, validation: int, test: int = 0):
    """finetune_config's fields of topic classification (LABELS) over csv files written into
    `directory`: `train`, `validation` and, where `test` is given, test rows (seeds 1, 2, 3)."""
    fields = {
        "task": "classification",
        "data.train": str(write_topic_csv(directory / "train.csv", topics, train, seed=1)),
        "data.validation": str(write_topic_csv(directory / "dev.csv", topics, validation, seed=2)),
    }
    if test:
        fields["data.test"] = str(write_topic_csv(directory / "test.csv", topics, test, seed=3))
    return fields


def finetune_config(init_from, **fields) -> ml_collections.ConfigDict:
    """configs/finetune.py sized for the synthetic tasks, from `init_from`, with `fields`
    (dotted names) set."""
    config = finetune_recipe.get_config()
    config.init_from = str(init_from)
    config.data.max_seq_length = 32
    config.batch_size = 16
    config.eval_batch_size = 32
    config.log_every_steps = 5
    config.update_from_flattened_dict(fields)
    return config
