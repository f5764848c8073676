"""A text's encoding and answers never depend on the other texts of a call.

Tokenizer files carry call-time settings (padding, truncation) that bertjax ignores, for every
kind of tokenizer; the notebook methods and fine-tuning's readers give a text the same result
alone as inside a batch of texts of very different lengths.
"""

import json

import pytest
from tokenizer_kinds import FILE_TRUNCATION, text_of, with_call_settings, write_tokenizer

from bertjax import hf
from bertjax.tokenizer import Tokenizer

FILE_KINDS = ("wordpiece", "pipeline")  # the kinds read from a tokenizer.json


@pytest.fixture(scope="module")
def plain_files(tmp_path_factory):
    """kind -> (directory, tokenizer) without call-time settings in its file."""
    root = tmp_path_factory.mktemp("plain")
    return {
        kind: (root / kind, write_tokenizer(kind, root / kind, padded=False)) for kind in FILE_KINDS
    }


@pytest.mark.parametrize("fixed", [None, 64], ids=["batch_longest", "fixed"])
@pytest.mark.parametrize("kind", FILE_KINDS)
def test_a_files_padding_and_truncation_never_shape_the_ids(kind, fixed, plain_files, tmp_path):
    directory, plain = plain_files[kind]
    text = (directory / "tokenizer.json").read_text()
    padded = with_call_settings(text, plain.pad_id, fixed=fixed)
    (tmp_path / "tokenizer.json").write_text(padded)
    (tmp_path / "tokenizer_config.json").write_text(
        (directory / "tokenizer_config.json").read_text()
    )
    short, long = "See [MASK] for details.", text_of(3 * FILE_TRUNCATION, seed=1)
    expected = [plain.encode(short), plain.encode(long)]
    assert len(expected[1]) > FILE_TRUNCATION and len(expected[0]) < FILE_TRUNCATION
    for tok in (Tokenizer.load(tmp_path / "tokenizer.json"), hf.load_tokenizer(tmp_path)):
        assert tok.kind == plain.kind and tok.fingerprint == plain.fingerprint
        assert tok.encode(short) == expected[0] and tok.encode(long) == expected[1]
        assert tok.encode_batch([short, long]) == expected
        assert tok.encode_batch([long, short]) == expected[::-1]
        in_text = tok.encode_batch([short, long], special_tokens_in_text=True)
        assert in_text[0] == plain.encode(short, special_tokens_in_text=True)
        assert tok.mask_id in in_text[0] and tok.pad_id not in in_text[0]
        assert [ids for ids, _ in tok.encode_with_offsets([short, long])] == expected
        assert tok.encode_words(["see", "details"]) == plain.encode_words(["see", "details"])
        # What bertjax writes back carries no call-time settings.
        tok.save(tmp_path / "saved.json")
        tok.save_hf(tmp_path / "export")
        for written in (tmp_path / "saved.json", tmp_path / "export" / "tokenizer.json"):
            spec = json.loads(written.read_text())
            assert spec["padding"] is None and spec["truncation"] is None
