"""What users type, as hypothesis strategies: texts that hold a special token's literal
("[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]", or a tokenizer.json's added tokens) between
words, glued to a word or to punctuation, once or several times. A notebook method reads each
literal as transformers' tokenizers do: as the token it names.
"""

from hypothesis import strategies as st

from bertjax.text.tokenizer import SPECIAL_PIECES
from tests.helpers.tokenizer_kinds import WORDS

SPECIAL_LITERALS = tuple(SPECIAL_PIECES)  # [PAD] [UNK] [CLS] [SEP] [MASK]
# How a literal meets the text around it: alone between spaces, glued to the word before or
# after it, or before a full stop.
GLUES = ("spaced", "after_word", "before_word", "before_stop")


@st.composite
def with_literals(draw, text: str, literals=SPECIAL_LITERALS, most: int = 3) -> str:
    """`text` with one to `most` literals drawn from `literals`, each at a drawn word of it
    and glued to its neighbours in a drawn way."""
    words = text.split()
    for _ in range(draw(st.integers(1, most))):
        literal = draw(st.sampled_from(literals))
        at = draw(st.integers(0, len(words)))
        glue = draw(st.sampled_from(GLUES))
        if glue == "after_word" and at > 0:
            words[at - 1] += literal
        elif glue == "before_word" and at < len(words):
            words[at] = literal + words[at]
        elif glue == "before_stop":
            words.insert(at, literal + ".")
        else:
            words.insert(at, literal)
    return " ".join(words)


def user_texts(literals=SPECIAL_LITERALS, max_words: int = 12):
    """Texts of 1 to `max_words` words of tokenizer_kinds.WORDS holding literals (with_literals)."""
    words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=max_words).map(" ".join)
    return words.flatmap(lambda text: with_literals(text, literals))
