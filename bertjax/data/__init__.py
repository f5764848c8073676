"""Pretraining data: corpus reading, instances, masking, storage and the loader."""

from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.loader import Loader, make_loader
from bertjax.data.masking import MaskingSettings, mask_batch

# bertjax.data.prepare is a package whose __main__ is the command line: `python -m` runs that
# submodule, which this import does not load (runpy warns when what it runs is already loaded).
from bertjax.data.prepare import prepare
from bertjax.data.prepare.tokenizer import TOKENIZER_SAMPLE_SENTENCES, train_mixture_tokenizer
from bertjax.data.storage import MANIFEST_FILE, read_manifest

__all__ = [
    "Loader",
    "MANIFEST_FILE",
    "MaskingSettings",
    "demo_corpus_path",
    "make_loader",
    "mask_batch",
    "TOKENIZER_SAMPLE_SENTENCES",
    "prepare",
    "train_mixture_tokenizer",
    "read_manifest",
]
