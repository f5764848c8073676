"""A corpus whose sentences carry their document's tag, for the preparation tests."""

import functools

from tests.helpers.corpora import write_random_corpus

NUM_DOCUMENTS = 240


# Every sentence carries its document's tag "q<index>q".
write_corpus = functools.partial(
    write_random_corpus,
    num_documents=NUM_DOCUMENTS,
    vocabulary=800,
    word_length=(2, 9),
    sentences=(2, 10),
    words=(4, 20),
    tag_documents=True,
)
