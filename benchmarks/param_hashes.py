"""SHA-256 of every parameter of a run's checkpoint, to show two code versions train alike.

    python -m benchmarks.param_hashes runs/tiny [more work directories ...]

Prints one line per run directory (its newest checkpoint, read with bertjax.load): the number
of parameter leaves and one digest over all of them. Two trees that train bit-identically
print the same lines.
"""

import argparse
import hashlib

import jax
import numpy as np

import bertjax


def digests(workdir: str) -> tuple[dict[str, str], str]:
    """({leaf path: sha256 of its bytes}, one sha256 over all of them) of a run's newest
    checkpoint."""
    _, params, _ = bertjax.load(workdir)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    each = {
        jax.tree_util.keystr(path): hashlib.sha256(np.asarray(leaf).tobytes()).hexdigest()
        for path, leaf in leaves
    }
    whole = hashlib.sha256("".join(f"{k}={v}" for k, v in sorted(each.items())).encode())
    return each, whole.hexdigest()


def line(name: str, workdir: str) -> str:
    """`<name>: <n> leaves, all <sha256>`."""
    each, whole = digests(workdir)
    return f"{name}: {len(each)} leaves, all {whole}"


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdirs", nargs="+", help="run directories")
    lines = [line(workdir, workdir) for workdir in parser.parse_args(argv).workdirs]
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
