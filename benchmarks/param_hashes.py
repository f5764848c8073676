"""SHA-256 of every parameter of a run's checkpoint, to show two code versions train alike.

    python benchmarks/param_hashes.py runs/tiny [more work directories ...]

Prints one digest per leaf path and one over all of them, per run directory (its newest
checkpoint, read with bertjax.load). Two trees that train bit-identically print the same
lines.
"""

import hashlib
import sys

import jax
import numpy as np

import bertjax


def digests(workdir: str) -> tuple[dict[str, str], str]:
    _, params, _ = bertjax.load(workdir)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    each = {
        jax.tree_util.keystr(path): hashlib.sha256(np.asarray(leaf).tobytes()).hexdigest()
        for path, leaf in leaves
    }
    whole = hashlib.sha256("".join(f"{k}={v}" for k, v in sorted(each.items())).encode())
    return each, whole.hexdigest()


def main() -> None:
    for workdir in sys.argv[1:]:
        each, whole = digests(workdir)
        print(f"{workdir}: {len(each)} leaves, all {whole}")


if __name__ == "__main__":
    main()
