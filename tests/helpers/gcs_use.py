"""Objects under a gs:// prefix and files under a directory, compared; fine-tuning rows written
to gs:// and a fine-tuning config for them."""

import pathlib

import numpy as np

from bertjax.storage import fs
from tests.helpers.corpora import finetune_config

WORDS = {
    "good": "the film was good and the acting was fine and warm",
    "bad": "the film was bad and the plot was dull and cold",
}


def _objects(gcs, url: str) -> dict[str, bytes]:
    """Every object under a gs:// prefix, by its name relative to the prefix."""
    gcs.fs.invalidate_cache()
    prefix = url.removeprefix("gs://").rstrip("/") + "/"
    return {name[len(prefix) :]: gcs.fs.cat_file(name) for name in gcs.fs.find(prefix)}


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {
        f.relative_to(directory).as_posix(): f.read_bytes()
        for f in directory.rglob("*")
        if f.is_file()
    }


def _write_rows(url: str, count: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        label = str(rng.choice(sorted(WORDS)))
        words = WORDS[label].split()
        rng.shuffle(words)
        rows.append(f"{' '.join(words)},{label}")
    fs.write_text(url, "sentence,label\n" + "\n".join(rows) + "\n")
    return url


def _finetune_config(init_from, **fields):
    config = finetune_config(init_from, **fields)
    config.num_epochs = 2
    config.optimizer.learning_rate = 1e-3
    return config
