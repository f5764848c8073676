"""ModernBERT on CPU: bertjax beside transformers (torch, sdpa), the same weights and inputs.

    python -m benchmarks.modernbert [--hidden 256 --layers 6 --heads 4 --intermediate 384]
        [--batch 8 --seq 512] [--lengths 512 1024 2048 4096] [--rounds 3]
        [--finetune reviews squad] [--ft_examples 256 --ft_epochs 1 --ft_batch 32]
        [--packing_sweep 0.5 0.7 0.85 1.0] [--attention] [--skip_sweep] [--skip_mlm]
        [--notebook 40] [--matmul_dtype bfloat16]

1. The forward pass (ModernBertModel's hidden states) and a masked-LM training step (30% of
   the tokens predicted, AdamW) on a batch of --batch texts of random lengths from a quarter of
   --seq to all of it: transformers padded to the longest (its CPU path; its unpadding needs
   flash-attn), bertjax padded with packing off (``packed_length`` None), bertjax unpadded
   (the same padded batch, its real tokens packed inside the encoder: ``packed_length``),
   and bertjax packed (the same texts as documents packed into fewer rows, each attending to
   itself, positions restarting per document). Tokens per second count real tokens only.
   --matmul_dtype bfloat16: bertjax's train steps (here and in --finetune) round their
   products' operands to it (model.matmul_dtype; transformers stays float32), after the
   float32 check. transformers trains in the harness's torch loop (AdamW).
2. The forward pass of one text against its length: local + global layers (a global layer
   every third, the rest windows of 128) against all layers global, on both sides; where the
   window pays is where local + global gets ahead of all-global.
3. --finetune: sequence-classification fine-tuning (AdamW, batches of --ft_batch) on texts
   whose lengths follow a real distribution: "reviews" (drug reviews: tokens p10/p50/p90/max
   32/106/170/461) or "squad" (SQuAD v1.1 windows of at most 384 tokens: 150/180/300/384;
   benchmarks.harness.fixtures.LENGTH_QUANTILES).
   bertjax takes the batches a fine-tuning run takes (shuffled, each cut to the smallest
   multiple of 32 that holds its longest text), padded and unpadded (``packed_length``: the
   fullest batch's real tokens); transformers' ModernBertForSequenceClassification runs a
   torch loop (the harness's) over length-sorted batches (each padded to its longest, the order
   shuffled).
   Each side's clock covers everything from its first step (bertjax: every compile) to its
   last; "steady" is the mean step after the first of each shape (torch: after the first
   step) times the number of steps.
4. --packing_sweep: the masked-LM train step, padded and unpadded, at batches whose real
   tokens fill the given shares of the slots: where the unpadded step stops paying is the
   rule bertjax.encoders.modernbert.model.PACKING_MAX_SHARE encodes.
5. --attention: one layer's attention on --batch rows of --seq (random lengths from a quarter
   of --seq, --heads heads of --hidden / --heads), forward and forward + backward:
   ModernBERT's einsum path (global: whole rows; local: chunks against their band) against
   bertjax.nn.attention's blocked path, the rounds interleaved.

6. --backward: the gradient of a sequence classifier's loss on --batch rows of 128 tokens,
   with the encoder's gradient materialised at each layer (mb_model.materialized_gradient,
   the default) and without it (the identity in its place), the rounds interleaved, beside
   the forward pass and transformers' ModernBertForSequenceClassification forward and
   backward; the two bertjax gradients are checked to agree (float rounding) first. Then how
   far each side is from the machine: XLA's count of the gradient's operations against the
   rate of one matmul of the layer's widest shape (median of 20), in jax and in torch.

7. --notebook N: N notebook calls (bertjax.Model's batching path, Model.batched with the
   mean embedding `Model.embed` runs), each of 8 texts of review lengths, unpadded (the
   default: a batch whose real tokens fill at most 0.7 of its slots runs packed) against
   padded (`unpad=False`), for ModernBERT and a BERT of the same size (random weights), the
   rounds interleaved; the outputs are checked to agree within 1e-4 first.

The whole command's clock (start-up, imports, every compile, every section) is printed last.
Like the commands, the process keeps the host memory a CPU step frees for the next
(bertjax.engine.host_memory; BERTJAX_KEEP_FREED_MEMORY=0 leaves glibc's defaults), both sides alike.

The model is a ModernBERT of random weights at the given size (transformers' initialisation,
written by save_pretrained and read by bertjax.encoders.read_transformers); both sides'
hidden states are checked to agree within 1e-3 before anything is timed. Times are medians
of --rounds rounds after a warm-up call (which compiles bertjax's programs), the sides of a
table in turn within each round (benchmarks.harness.timing); both sides run in float32 with
all the machine's cores.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks.harness import fixtures, reference, report, timing  # noqa: E402
from bertjax import encoders, inference  # noqa: E402
from bertjax.capability import ENCODER  # noqa: E402
from bertjax.data.packing import best_fit  # noqa: E402
from bertjax.encoders.bert.config import BertConfig  # noqa: E402
from bertjax.encoders.modernbert import attention as mb_attention  # noqa: E402
from bertjax.encoders.modernbert import config as mb_config  # noqa: E402
from bertjax.encoders.modernbert import model as mb_model  # noqa: E402
from bertjax.engine import host_memory  # noqa: E402
from bertjax.inference import batching  # noqa: E402
from bertjax.nn import attention as attention_lib  # noqa: E402
from bertjax.tasks.labels import model as label_model  # noqa: E402
from bertjax.text.tokenizer import WordPieceTokenizer  # noqa: E402

TOLERANCE = 1e-3
PAD, CLS, SEP, VOCAB = 0, 1, 2, 1000


def hf_model(args, every: int):
    """A transformers ModernBertForMaskedLM of random weights, and the same model in bertjax."""
    torch, transformers = reference.torch, reference.transformers
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        global_attn_every_n_layers=every,
        local_attention=128,
        max_position_embeddings=max(args.lengths + [args.seq]),
        pad_token_id=PAD,
        cls_token_id=CLS,
        sep_token_id=SEP,
        bos_token_id=CLS,
        eos_token_id=SEP,
        sparse_prediction=True,  # logits at the labelled positions only, as bertjax computes
        attn_implementation="sdpa",
    )
    model = transformers.ModernBertForMaskedLM(config)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        ours, params, _, _ = encoders.read_transformers(directory, dtype="float32")
    return model, ours, jax.device_put(params)


def products_note(args) -> str:
    """What a table's header adds when bertjax's train steps take --matmul_dtype."""
    return f" (bertjax's train steps: {args.matmul_dtype} products)" if args.matmul_dtype else ""


def texts(args, rng) -> list[np.ndarray]:
    """--batch texts of random ids, lengths from a quarter of --seq to all of it."""
    lengths = rng.integers(args.seq // 4, args.seq + 1, args.batch)
    return fixtures.token_rows(rng, lengths, VOCAB, CLS, SEP)


def padded(rows: list[np.ndarray], seq: int) -> dict[str, np.ndarray]:
    return fixtures.padded(rows, seq, PAD)


def packed(rows: list[np.ndarray], seq: int) -> tuple[dict[str, np.ndarray], list[tuple]]:
    """The texts as documents packed into rows of seq (best fit), with document ids and
    positions restarting per document; and where each text went: (row, start)."""
    bins = best_fit([len(r) for r in rows], seq)
    ids = np.full((len(bins), seq), PAD, np.int32)
    documents = np.zeros_like(ids)
    positions = np.zeros_like(ids)
    where = [None] * len(rows)
    for b, members in enumerate(bins):
        at = 0
        for d, index in enumerate(members):
            n = len(rows[index])
            ids[b, at : at + n] = rows[index]
            documents[b, at : at + n] = d + 1
            positions[b, at : at + n] = np.arange(n)
            where[index] = (b, at)
            at += n
    batch = {
        "input_ids": ids,
        "attention_mask": (documents > 0).astype(np.int32),
        "document_ids": documents,
        "positions": positions,
    }
    return batch, where


def masked(batch: dict[str, np.ndarray], rng) -> dict[str, np.ndarray]:
    """30% of the real tokens as predictions: positions, targets, weights (bertjax's) and
    labels (transformers': -100 elsewhere)."""
    real = batch["attention_mask"].astype(bool)
    count = int(0.3 * real.sum(axis=1).max()) + 1
    positions = np.zeros((len(real), count), np.int32)
    weights = np.zeros((len(real), count), np.float32)
    labels = np.full(real.shape, -100, np.int64)
    for i, row in enumerate(real):
        chosen = rng.permutation(np.flatnonzero(row))[: int(0.3 * row.sum())]
        positions[i, : len(chosen)] = chosen
        weights[i, : len(chosen)] = 1.0
        labels[i, chosen] = batch["input_ids"][i, chosen]
    targets = np.take_along_axis(batch["input_ids"], positions, axis=1)
    return {
        **batch,
        "positions": positions,
        "targets": targets,
        "weights": weights,
        "labels": labels,
    }


def median_time(function, rounds: int) -> float:
    """One side alone: a warm-up call (it compiles), then the median of `rounds`."""
    return timing.time_call(function, rounds=rounds).median


def interleaved(sides: dict[str, Any], rounds: int) -> dict[str, float]:
    """Median seconds of each side, the sides in turn within each round."""
    return {name: t.median for name, t in timing.time_rounds(sides, rounds=rounds).items()}


def ours_forward(config, params):
    encoder = mb_model.Encoder(config)

    @jax.jit
    def forward(params, batch):
        sequence, _ = encoder.apply(
            {"params": params[ENCODER]},
            batch["input_ids"],
            None,
            batch["attention_mask"],
            document_ids=batch.get("document_ids"),
            positions=batch.get("positions"),
        )
        return sequence  # [b, s, h]

    return forward


def packed_length(mask: np.ndarray) -> int:
    """Slots that hold every real token of `mask`, a multiple of 8 (one batch shard)."""
    return -(-int(mask.sum()) // 8) * 8


def ours_train_step(config, params, packed_length: int | None = None):
    model = mb_model.MaskedLM(config)
    optimizer = optax.adamw(1e-4)

    def loss_fn(params, batch):
        logits = model.apply(
            {"params": params},
            batch["input_ids"],
            None,
            batch["attention_mask"],
            batch["positions_mlm"],
            document_ids=batch.get("document_ids"),
            positions=batch.get("positions"),
            deterministic=False,  # training, as train.py runs it
            packed_length=packed_length,
            rngs={"dropout": jax.random.key(1)},
        ).mlm_logits
        log_probs = jax.nn.log_softmax(logits)
        picked = jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
        return -jnp.sum(picked * batch["weights"]) / jnp.sum(batch["weights"])

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, optimizer.init(params)


def torch_inputs(batch, labels: bool = False) -> dict[str, Any]:
    """A batch's ids and mask (and its labels) as transformers' inputs."""
    names = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    return reference.tensors(batch, names=names | ({"labels": "labels"} if labels else {}))


def compare_and_time(args) -> dict[str, float]:
    torch = reference.torch
    rng = np.random.default_rng(0)
    model, config, params = hf_model(args, every=3)
    rows = texts(args, rng)
    real_tokens = sum(len(r) for r in rows)
    pad = padded(rows, args.seq)
    pack, where = packed(rows, args.seq)
    forward = ours_forward(config, params)

    model.eval()
    with torch.no_grad():
        theirs = model.model(**torch_inputs(pad)).last_hidden_state.numpy()
    ours = np.asarray(forward(params, pad))
    ours_packed = np.asarray(forward(params, pack))
    difference = max(
        float(np.abs(ours[i, : len(r)] - theirs[i, : len(r)]).max()) for i, r in enumerate(rows)
    )
    difference_packed = max(
        float(np.abs(ours_packed[b, at : at + len(r)] - ours[i, : len(r)]).max())
        for i, (r, (b, at)) in enumerate(zip(rows, where))
    )
    print(
        f"hidden states: bertjax - transformers max |diff| {difference:.1e}; bertjax packed - "
        f"padded {difference_packed:.1e}"
    )
    if max(difference, difference_packed) > TOLERANCE:
        sys.exit(f"outputs differ by more than {TOLERANCE}")

    def torch_forward():
        with torch.no_grad():
            model.model(**torch_inputs(pad))

    results = interleaved(
        {
            "forward: transformers padded": torch_forward,
            "forward: bertjax padded": lambda: forward(params, pad),
            "forward: bertjax packed": lambda: forward(params, pack),
        },
        args.rounds,
    )

    torch_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pad_masked = masked(pad, rng)
    torch_batch = torch_inputs(pad_masked, labels=True)
    # Checked against transformers in float32 above; the train steps take the products'
    # operand dtype asked for (the model.matmul_dtype a run sets).
    config = dataclasses.replace(config, matmul_dtype=args.matmul_dtype)

    def torch_step():
        return reference.train(model, [torch_batch], torch_optimizer)

    step, opt_state = ours_train_step(config, params)
    state = {"params": params, "opt": opt_state}

    def our_step(batch):
        state["params"], state["opt"], loss = step(state["params"], state["opt"], batch)
        return loss

    ours_pad = {**pad_masked, "positions_mlm": pad_masked["positions"]}
    del ours_pad["positions"], ours_pad["labels"]
    pack_masked = masked(pack, rng)  # its "positions" are the predictions'
    ours_pack = {**pack_masked, "positions_mlm": pack_masked["positions"]}
    ours_pack["positions"] = pack["positions"]  # the documents' rotary positions
    del ours_pack["labels"]
    unpadded_step, _ = ours_train_step(config, params, packed_length(pad["attention_mask"]))

    def our_unpadded_step(batch):
        state["params"], state["opt"], loss = unpadded_step(state["params"], state["opt"], batch)
        return loss

    results |= interleaved(
        {
            "train step: transformers padded": torch_step,
            "train step: bertjax padded": lambda: our_step(ours_pad),
            "train step: bertjax unpadded": lambda: our_unpadded_step(ours_pad),
            "train step: bertjax packed": lambda: our_step(ours_pack),
        },
        args.rounds,
    )

    print(
        f"\n{args.batch} texts of {args.seq // 4}..{args.seq} tokens ({real_tokens} real tokens; "
        f"{len(pack['input_ids'])} packed rows of {args.seq}), "
        f"L{args.layers}/H{args.hidden}/A{args.heads}, float32" + products_note(args) + "\n"
    )
    print(f"{'':<34}{'seconds':>10}{'tokens/s':>12}{'x transformers':>16}")
    figures = {}
    for name, seconds in results.items():
        kind = name.split(":")[0]
        base = results[f"{kind}: transformers padded"]
        print(f"{name:<34}{seconds:>10.3f}{real_tokens / seconds:>12.0f}{base / seconds:>16.2f}")
        figures[f"{name} tokens/s"] = real_tokens / seconds
        figures[f"{name} x transformers"] = base / seconds
    return figures


def length_sweep(args) -> dict[str, list[float]]:
    torch = reference.torch
    print("\nforward of one text against its length (seconds; local layers: windows of 128)\n")
    columns = ("bertjax l+g", "bertjax global", "transformers l+g", "transformers global")
    print(f"{'length':>8}" + "".join(f"{c:>22}" for c in columns))
    models = {every: hf_model(args, every) for every in (3, 1)}
    rng = np.random.default_rng(1)
    table: dict[str, list[float]] = {column: [] for column in columns}
    for length in args.lengths:
        ids = rng.integers(SEP + 1, VOCAB, (1, length)).astype(np.int32)
        batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        sides = {}
        for every, kind in ((3, "l+g"), (1, "global")):
            model, config, params = models[every]
            forward = ours_forward(config, params)
            sides[f"bertjax {kind}"] = lambda f=forward, p=params, b=batch: f(p, b)
            model.eval()

            def run(model=model, batch=batch):
                with torch.no_grad():
                    model.model(**torch_inputs(batch))

            sides[f"transformers {kind}"] = run
        seconds = interleaved(sides, args.rounds)
        for column in columns:
            table[column].append(seconds[column])
        print(f"{length:>8}" + "".join(f"{seconds[c]:>22.3f}" for c in columns), flush=True)
    return {"lengths": list(args.lengths), **table}


# ---------------------------------------------------------------------------------------------
# 3. Fine-tuning on real length distributions.

# The length distributions --finetune takes (fixtures.LENGTH_QUANTILES).
FINETUNE_LENGTHS = ("reviews", "squad")
FT_WIDTH_STEP = 32  # batches are cut to a multiple of this (finetune's length_bucket)


def bertjax_batches(rows, labels, batch_size, epochs, rng):
    """A fine-tuning run's batches: shuffled each epoch, each padded to the smallest multiple
    of FT_WIDTH_STEP that holds its longest text."""
    out = []
    for _ in range(epochs):
        order = rng.permutation(len(rows))
        for start in range(0, len(rows) - batch_size + 1, batch_size):
            chosen = order[start : start + batch_size]
            longest = max(len(rows[i]) for i in chosen)
            width = -(-longest // FT_WIDTH_STEP) * FT_WIDTH_STEP
            batch = padded([rows[i] for i in chosen], width)
            batch["labels"] = labels[chosen]
            out.append(batch)
    return out


def torch_batches(rows, labels, batch_size, epochs, rng):
    """A length-sorted torch loop's batches: sorted by length, cut into batches, each padded
    to its longest, the batches' order shuffled each epoch."""
    by_length = np.argsort([len(r) for r in rows], kind="stable")
    groups = [
        by_length[start : start + batch_size]
        for start in range(0, len(rows) - batch_size + 1, batch_size)
    ]
    out = []
    for _ in range(epochs):
        for g in rng.permutation(len(groups)):
            chosen = groups[g]
            batch = padded([rows[i] for i in chosen], max(len(rows[i]) for i in chosen))
            batch["labels"] = labels[chosen]
            out.append(batch)
    return out


def classifier_config(args) -> mb_config.ModernBertConfig:
    """The benchmark's ModernBERT at the given size, float32, windows of 128."""
    return mb_config.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_layers=args.layers,
        num_heads=args.heads,
        local_attention=128,
        pad_token_id=PAD,
        cls_token_id=CLS,
        sep_token_id=SEP,
        dtype="float32",
    )


def ours_classifier_step(config, num_labels: int):
    model = label_model.SequenceClassifier(config, num_labels)
    optimizer = optax.adamw(2e-5)
    params = model.init({"params": jax.random.key(0)}, jnp.zeros((1, 8), jnp.int32))["params"]

    def loss_fn(params, batch, packed_length):
        logits = model.apply(
            {"params": params},
            batch["input_ids"],
            None,
            batch["attention_mask"],
            deterministic=False,  # training, as finetune.py runs it (kernels are chosen so)
            packed_length=packed_length,
            rngs={"dropout": jax.random.key(1)},
        )  # [b, labels]
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, batch["labels"][:, None], axis=1))

    def step(params, opt_state, batch, packed_length):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, packed_length)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, static_argnums=3), params, optimizer.init(params)


def timed_run(batches, run_step, compiles: bool) -> tuple[float, float]:
    """(clock from the first step to the last, the steady clock: the mean step time over the
    steps after the first of each shape (`compiles`) or after the first step, times the
    number of steps)."""
    seen = set()
    total = 0.0
    steady = []
    for index, batch in enumerate(batches):
        seconds = timing.time_call(lambda b=batch: run_step(b), rounds=1, warmup=0).median
        total += seconds
        shape = batch["input_ids"].shape
        if (shape in seen) if compiles else index > 0:
            steady.append(seconds)
        seen.add(shape)
    return total, (float(np.mean(steady)) * len(batches) if steady else float("nan"))


def finetune(args, kind: str) -> dict[str, float]:
    torch, transformers = reference.torch, reference.transformers
    rng = np.random.default_rng(2)
    lengths = fixtures.quantile_lengths(kind, args.ft_examples, rng)
    rows = fixtures.token_rows(rng, lengths, VOCAB, CLS, SEP)
    labels = rng.integers(0, 2, len(rows)).astype(np.int32)
    ours_batches = bertjax_batches(rows, labels, args.ft_batch, args.ft_epochs, rng)
    theirs_batches = torch_batches(rows, labels, args.ft_batch, args.ft_epochs, rng)
    real = sum(int(b["attention_mask"].sum()) for b in ours_batches)
    slots = sum(b["attention_mask"].size for b in ours_batches)
    widths = sorted({b["input_ids"].shape[1] for b in ours_batches})
    capacity = max(packed_length(b["attention_mask"]) for b in ours_batches)

    config = dataclasses.replace(classifier_config(args), matmul_dtype=args.matmul_dtype)
    results = {}
    for name, length in (("bertjax padded", None), ("bertjax unpadded", capacity)):
        step, params, opt_state = ours_classifier_step(config, 2)
        state = {"params": params, "opt": opt_state}

        def run_ours(batch, step=step, state=state, length=length):
            batch = {k: jnp.asarray(v) for k, v in batch.items()}
            state["params"], state["opt"], loss = step(state["params"], state["opt"], batch, length)
            return loss

        results[name] = timed_run(ours_batches, run_ours, compiles=True)

    torch.manual_seed(0)
    hf_config = transformers.ModernBertConfig(
        **{**config.to_hf_dict(), "num_labels": 2}, attn_implementation="sdpa"
    )
    model = transformers.ModernBertForSequenceClassification(hf_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

    def run_torch(batch):
        return reference.train(model, [torch_inputs(batch, labels=True)], optimizer)

    results["transformers length-sorted"] = timed_run(theirs_batches, run_torch, compiles=False)

    p10, p50, p90 = np.percentile(lengths, [10, 50, 90]).round().astype(int)
    print(
        f"\nfine-tuning, {kind}: {len(rows)} texts (tokens p10/p50/p90/max {p10}/{p50}/{p90}/"
        f"{lengths.max()}), {len(ours_batches)} steps of {args.ft_batch}; bertjax widths {widths}, "
        f"{100 * real / slots:.0f}% real tokens, unpadded into {capacity} slots; "
        f"L{args.layers}/H{args.hidden}/A{args.heads}, float32" + products_note(args) + "\n"
    )
    base_total, base_steady = results["transformers length-sorted"]
    print(f"{'':<30}{'clock s':>10}{'steady s':>10}{'x torch clock':>15}{'x torch steady':>16}")
    figures = {}
    for name, (total, steady) in results.items():
        print(
            f"{name:<30}{total:>10.1f}{steady:>10.1f}{base_total / total:>15.2f}"
            f"{base_steady / steady:>16.2f}"
        )
        figures |= {f"{kind} {name} clock s": total, f"{kind} {name} steady s": steady}
    return figures


# ---------------------------------------------------------------------------------------------
# 4. Where unpadding pays.


def packing_sweep(args) -> dict[str, list[float]]:
    print("\nmasked-LM train step, padded against unpadded, by share of real tokens\n")
    print(f"{'share':>8}{'padded s':>12}{'unpadded s':>12}{'x padded':>10}")
    _, config, params = hf_model(args, every=3)
    rng = np.random.default_rng(3)
    padded_step, opt_state = ours_train_step(config, params)
    table: dict[str, list[float]] = {"share": [], "padded s": [], "unpadded s": []}
    for share in args.packing_sweep:
        # Rows of random lengths around `share` of --seq (closer together as it nears 1).
        spread = 0.5 * (1.0 - share) * args.seq
        lengths = np.clip(np.round(rng.normal(share * args.seq, spread, args.batch)), 2, args.seq)
        rows = fixtures.token_rows(rng, lengths.astype(int), VOCAB, CLS, SEP)
        batch = masked(padded(rows, args.seq), rng)
        batch["positions_mlm"] = batch.pop("positions")
        del batch["labels"]
        saved = mb_model.PACKING_MAX_SHARE
        mb_model.PACKING_MAX_SHARE = 1.0  # measure packing even where the rule would skip it
        unpadded_step, _ = ours_train_step(config, params, packed_length(batch["attention_mask"]))
        steps = {"padded": padded_step, "unpadded": unpadded_step}
        try:
            times = interleaved(
                {n: lambda f=f, b=batch: f(params, opt_state, b)[2] for n, f in steps.items()},
                args.rounds,
            )
        finally:
            mb_model.PACKING_MAX_SHARE = saved
        real = float(batch["attention_mask"].mean())
        print(
            f"{real:>8.2f}{times['padded']:>12.3f}{times['unpadded']:>12.3f}"
            f"{times['padded'] / times['unpadded']:>10.2f}",
            flush=True,
        )
        for column, value in zip(table, (real, times["padded"], times["unpadded"])):
            table[column].append(value)
    return table


# ---------------------------------------------------------------------------------------------
# 5. Attention alone: the einsum path against the blocked one.


def attention_paths(args) -> dict[str, float]:
    batch, seq, heads = args.batch, args.seq, args.heads
    dim = args.hidden // heads
    window = 64  # ModernBERT's local_attention of 128
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.normal(size=(batch, seq, heads, dim)), jnp.float32) for _ in "qkv")
    lengths = rng.integers(seq // 4, seq + 1, batch)
    mask = jnp.asarray((np.arange(seq)[None] < lengths[:, None]).astype(np.int32))  # [b, s]

    def einsum_global(q, k, v):
        logits = jnp.einsum("bsnd,btnd->bnst", q, k, preferred_element_type=jnp.float32)
        visible = mb_attention.global_mask(mask, None)[:, None]  # [b, 1, s, t]
        logits = jnp.where(visible, logits * np.float32(dim**-0.5), mb_attention._MASK_VALUE)
        return jnp.einsum("bnst,btnd->bsnd", jax.nn.softmax(logits, axis=-1), v)

    def einsum_local(q, k, v):
        return mb_attention._banded_attention(
            q, k, v, mb_attention.local_mask(mask, None, window), window, lambda w: w
        )

    def blocked(local_window):
        return lambda q, k, v: attention_lib.dot_product_attention(
            q, k, v, mask, implementation="blocked", document_ids=mask, local_window=local_window
        )

    paths = {
        "global, einsum": einsum_global,
        "global, blocked": blocked(None),
        "local, einsum": einsum_local,
        "local, blocked": blocked(window),
    }
    real = mask[:, :, None, None]
    programs = {}
    for name, f in paths.items():
        programs[f"{name}: forward"] = jax.jit(f)
        loss = lambda q, k, v, f=f: jnp.sum(f(q, k, v) * real)  # noqa: E731
        programs[f"{name}: forward + backward"] = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for kind in ("global", "local"):
        a, b = programs[f"{kind}, einsum: forward"], programs[f"{kind}, blocked: forward"]
        difference = float(jnp.max(jnp.abs((a(q, k, v) - b(q, k, v)) * real)))
        print(f"\nattention {kind}: blocked - einsum max |diff| on real tokens {difference:.1e}")
    times = interleaved(
        {name: lambda p=program: p(q, k, v) for name, program in programs.items()}, args.rounds
    )
    print(f"\n{batch} rows of {seq}, {heads} heads of {dim}, window +-{window}; ms (median)\n")
    figures = {}
    for kind in ("global", "local"):
        for part in ("forward", "forward + backward"):
            einsum = times[f"{kind}, einsum: {part}"]
            block = times[f"{kind}, blocked: {part}"]
            print(
                f"{kind + ', ' + part:<28} einsum {1e3 * einsum:8.1f}  blocked "
                f"{1e3 * block:8.1f}  x einsum {einsum / block:5.2f}"
            )
            figures[f"{kind}, {part}: blocked x einsum"] = einsum / block
    return figures


# ---------------------------------------------------------------------------------------------
# 6. The backward pass.

BACKWARD_SEQ = 128


def backward_pass(args) -> dict[str, float]:
    torch, transformers = reference.torch, reference.transformers
    config = classifier_config(args)
    rng = np.random.default_rng(5)
    ids = jnp.asarray(rng.integers(SEP + 1, VOCAB, (args.batch, BACKWARD_SEQ)), jnp.int32)
    mask = jnp.ones_like(ids)
    model = label_model.SequenceClassifier(config, 2)
    params = model.init({"params": jax.random.key(0)}, ids[:1, :8])["params"]

    def loss(params):
        return jnp.sum(model.apply({"params": params}, ids, None, mask))

    forward = jax.jit(loss)
    materialized = jax.jit(jax.grad(loss))
    boundary = mb_model.materialized_gradient
    mb_model.materialized_gradient = lambda x: x  # read by EncoderLayer when traced
    try:
        fused = jax.jit(jax.grad(loss)).lower(params).compile()
    finally:
        mb_model.materialized_gradient = boundary
    # jax reuses the layers' traces otherwise, with what they called when first traced.
    jax.clear_caches()
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-10),
        materialized(params),
        fused(params),
    )

    torch.manual_seed(0)
    hf_config = transformers.ModernBertConfig(
        **{**config.to_hf_dict(), "num_labels": 2}, attn_implementation="sdpa"
    )
    theirs = transformers.ModernBertForSequenceClassification(hf_config).train()
    torch_ids = torch.from_numpy(np.asarray(ids)).long()

    def torch_backward():
        theirs.zero_grad()
        theirs(input_ids=torch_ids).logits.sum().backward()

    times = interleaved(
        {
            "bertjax forward": lambda: forward(params),
            "bertjax gradient, materialised per layer": lambda: materialized(params),
            "bertjax gradient, without the boundary": lambda: fused(params),
            "transformers forward + backward": torch_backward,
        },
        args.rounds,
    )
    print(
        f"\nbackward pass: {args.batch} rows of {BACKWARD_SEQ} tokens, L{args.layers}/"
        f"H{args.hidden}/A{args.heads}, float32, medians of {args.rounds} rounds "
        "(the two bertjax gradients agree)\n"
    )
    for name, seconds in times.items():
        print(f"{name:<45}{seconds * 1000:>10.1f} ms")
    fused_s = times["bertjax gradient, without the boundary"]
    ours_s = times["bertjax gradient, materialised per layer"]
    torch_s = times["transformers forward + backward"]
    print(
        f"materialised / without the boundary: {fused_s / ours_s:.2f}x; "
        f"transformers / materialised: {torch_s / ours_s:.2f}x"
    )
    # How far either side is from what the machine can do: XLA's count of the gradient's
    # floating-point operations against the rate of one dense matmul of the layer's
    # widest shape (tokens x hidden by hidden x 3 x hidden), on each side.
    cost = materialized.lower(params).compile().cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
    peak_jax, peak_torch = matmul_rates(args.batch * BACKWARD_SEQ, args.hidden, 3 * args.hidden)
    print(
        f"the gradient: {flops / 1e9:.1f} GFLOP (XLA's count); one matmul of its widest shape "
        f"runs at {peak_jax / 1e9:.0f} GFLOP/s in jax, {peak_torch / 1e9:.0f} in torch: "
        f"bertjax's gradient at {flops / ours_s / peak_jax:.0%} of that rate, transformers' at "
        f"{flops / torch_s / peak_torch:.0%}; at the whole rate the gradient would take "
        f"{1e3 * flops / peak_jax:.0f} ms, {torch_s / (flops / peak_jax):.2f}x transformers"
    )
    return {
        "gradient ms": 1e3 * ours_s,
        "without the boundary ms": 1e3 * fused_s,
        "transformers forward + backward ms": 1e3 * torch_s,
        "gradient GFLOP": flops / 1e9,
        "matmul GFLOP/s jax": peak_jax / 1e9,
        "matmul GFLOP/s torch": peak_torch / 1e9,
    }


def matmul_rates(rows: int, inner: int, columns: int, rounds: int = 20) -> tuple[float, float]:
    """Floating-point operations per second of one [rows, inner] x [inner, columns] float32
    matmul: jax (jit), then torch; the median of `rounds`."""
    torch = reference.torch
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape, np.float32) for shape in ((rows, inner), (inner, columns)))
    matmul = jax.jit(jnp.matmul)
    ja, jb, ta, tb = jnp.asarray(a), jnp.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
    operations = 2.0 * rows * inner * columns
    jax_s = median_time(lambda: matmul(ja, jb), rounds)
    torch_s = median_time(lambda: torch.matmul(ta, tb), rounds)
    return operations / jax_s, operations / torch_s


def notebook_calls(args) -> dict[str, float]:
    """Model.batched's mean embeddings over calls of 8 review-length texts: unpadded against
    padded, ModernBERT and BERT of the benchmark's size."""
    rng = np.random.default_rng(0)
    calls = []
    for _ in range(args.notebook):
        lengths = np.minimum(fixtures.quantile_lengths("reviews", 8, rng), 512)
        calls.append(
            [
                {"input_ids": rng.integers(SEP + 1, VOCAB, n).astype(np.int32)}
                | {"segment_ids": np.zeros(n, np.int32)}
                for n in lengths
            ]
        )
    tokenizer = WordPieceTokenizer(list(fixtures.SPECIAL_PIECES))
    size = dict(hidden_size=args.hidden, intermediate_size=args.intermediate)
    size |= dict(num_layers=args.layers, num_heads=args.heads, max_position_embeddings=512)
    configs = {
        "ModernBERT": mb_config.ModernBertConfig(
            vocab_size=VOCAB, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP, **size
        ),
        "BERT": BertConfig(vocab_size=VOCAB, **size),
    }
    print(f"\nnotebook calls: {args.notebook} calls of 8 review-length texts, mean embeddings")
    figures = {}
    for name, config in configs.items():
        config = dataclasses.replace(config, dtype="float32")
        params = jax.jit(encoders.family_of(config).pretraining_init(config))(jax.random.key(0))
        model = inference.Model(config, params, tokenizer, progress=False)
        unpadded, padded, share = _time_notebook_calls(model, calls, args.rounds)
        print(
            f"  {name}: unpadded {unpadded:.2f} s, padded {padded:.2f} s: "
            f"{padded / unpadded:.2f}x ({100 * share:.0f} % of the batches packed)",
            flush=True,
        )
        figures[f"notebook {name} padded / unpadded"] = padded / unpadded
    return figures


def _time_notebook_calls(model, calls, rounds: int) -> tuple[float, float, float]:
    """(median seconds unpadded, padded, share of the batches packed) of the calls."""
    function = functools.partial(
        inference._embed, config=model.run_config, pooling="mean", normalize=False
    )

    def run(unpad: bool) -> list[np.ndarray]:
        model.batcher.unpad = unpad
        out = []
        for features in calls:
            vectors = np.zeros((len(features), model.config.hidden_size), np.float32)
            for rows, batch in model.batched(function, features):
                vectors[rows] = batch
            out.append(vectors)
        return out

    choose, chosen = batching.fitted_packed_length, []

    def counting(mask, shards=1):
        chosen.append(choose(mask, shards))
        return chosen[-1]

    batching.fitted_packed_length = counting
    try:
        for a, b in zip(run(True), run(False)):  # also the warm-up: every bucket compiles
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    finally:
        batching.fitted_packed_length = choose
    share = sum(length is not None for length in chosen) / max(len(chosen), 1)
    # The comparison above was both sides' warm-up.
    times = timing.time_rounds(
        {"unpadded": lambda: run(True), "padded": lambda: run(False)}, rounds=rounds, warmup=0
    )
    return times["unpadded"].median, times["padded"].median, share


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip_sweep", action="store_true")
    parser.add_argument("--skip_mlm", action="store_true")
    parser.add_argument("--finetune", nargs="*", default=[], choices=FINETUNE_LENGTHS)
    parser.add_argument("--ft_examples", type=int, default=256)
    parser.add_argument("--ft_epochs", type=int, default=1)
    parser.add_argument("--ft_batch", type=int, default=32)
    parser.add_argument("--packing_sweep", type=float, nargs="*", default=[])
    parser.add_argument("--attention", action="store_true")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--notebook", type=int, default=0, help="notebook calls to time")
    parser.add_argument(
        "--matmul_dtype",
        default=None,
        help="bertjax's masked-LM and --finetune train steps with model.matmul_dtype (bfloat16)",
    )
    report.add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} is invalid: must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report.use_cpu()
    # As the commands do (bertjax.cli), before jax creates its CPU client; it holds for the
    # whole process, transformers' side included.
    kept = host_memory.keep_freed_memory()
    reference.use_threads()
    machine = report.start("modernbert", argv)
    print(f"freed host memory kept for the next step (bertjax.engine.host_memory): {kept}")
    figures: dict[str, Any] = {}
    if not args.skip_mlm:
        figures["masked LM"] = compare_and_time(args)
    if not args.skip_sweep:
        figures["length sweep"] = length_sweep(args)
    for kind in args.finetune:
        figures[f"finetune {kind}"] = finetune(args, kind)
    if args.packing_sweep:
        figures["packing sweep"] = packing_sweep(args)
    if args.attention:
        figures["attention"] = attention_paths(args)
    if args.backward:
        figures["backward"] = backward_pass(args)
    if args.notebook:
        figures["notebook"] = notebook_calls(args)
    figures["whole command s"] = time.perf_counter() - STARTED
    print(f"\nthe whole command: {figures['whole command s']:.1f} s")
    report.finish("modernbert", args, figures, machine)
    return figures


if __name__ == "__main__":
    main()
