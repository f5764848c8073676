"""ModernBERT on CPU: bertjax beside transformers (torch, sdpa), the same weights and inputs.

    python benchmarks/modernbert.py [--hidden 256 --layers 6 --heads 4 --intermediate 384]
        [--batch 8 --seq 512] [--lengths 512 1024 2048 4096] [--rounds 3]

1. The forward pass (ModernBertModel's hidden states) and a masked-LM training step (30% of
   the tokens predicted, AdamW) on a batch of --batch texts of random lengths from a quarter of
   --seq to all of it: transformers padded to the longest (its CPU path; its unpadding needs
   flash-attn), bertjax padded, and bertjax packed (the same texts as documents packed into
   fewer rows, each attending to itself, positions restarting per document). Tokens per
   second count real tokens only.
2. The forward pass of one text against its length: local + global layers (a global layer
   every third, the rest windows of 128) against all layers global, on both sides; where the
   window pays is where local + global gets ahead of all-global.

The model is a ModernBERT of random weights at the given size (transformers' initialisation,
written by save_pretrained and read by bertjax.encoders.read_transformers); both sides'
hidden states are checked to agree within 1e-3 before anything is timed. Times are medians
of --rounds runs after a warm-up (which compiles bertjax's programs); both sides run in
float32 with all the machine's cores.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bertjax import encoders  # noqa: E402
from bertjax.data.packing import best_fit  # noqa: E402
from bertjax.encoders import modernbert_family  # noqa: E402

TOLERANCE = 1e-3
PAD, CLS, SEP, VOCAB = 0, 1, 2, 1000


def hf_model(args, every: int):
    """A transformers ModernBertForMaskedLM of random weights, and the same model in bertjax."""
    import torch
    import transformers

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


def texts(args, rng) -> list[np.ndarray]:
    lengths = rng.integers(args.seq // 4, args.seq + 1, args.batch)
    out = []
    for n in lengths:
        ids = rng.integers(SEP + 1, VOCAB, n)
        ids[0], ids[-1] = CLS, SEP
        out.append(ids.astype(np.int32))
    return out


def padded(rows: list[np.ndarray], seq: int) -> dict[str, np.ndarray]:
    ids = np.full((len(rows), seq), PAD, np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return {"input_ids": ids, "attention_mask": (ids != PAD).astype(np.int32)}


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
    function()  # warm-up: compiles
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours_forward(config, params):
    encoder = modernbert_family.Encoder(config)

    @jax.jit
    def forward(params, batch):
        sequence, _ = encoder.apply(
            {"params": params["bert"]},
            batch["input_ids"],
            None,
            batch["attention_mask"],
            document_ids=batch.get("document_ids"),
            positions=batch.get("positions"),
        )
        return sequence  # [b, s, h]

    return forward


def ours_train_step(config, params):
    model = modernbert_family.MaskedLM(config)
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


def torch_inputs(batch):
    import torch

    return {
        "input_ids": torch.from_numpy(batch["input_ids"]).long(),
        "attention_mask": torch.from_numpy(batch["attention_mask"]).long(),
    }


def compare_and_time(args) -> None:
    import torch

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

    results = {
        "forward: transformers padded": median_time(torch_forward, args.rounds),
        "forward: bertjax padded": median_time(
            lambda: forward(params, pad).block_until_ready(), args.rounds
        ),
        "forward: bertjax packed": median_time(
            lambda: forward(params, pack).block_until_ready(), args.rounds
        ),
    }

    model.train()
    torch_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pad_masked = masked(pad, rng)

    def torch_step():
        inputs = torch_inputs(pad_masked)
        loss = model(**inputs, labels=torch.from_numpy(pad_masked["labels"])).loss
        torch_optimizer.zero_grad()
        loss.backward()
        torch_optimizer.step()

    step, opt_state = ours_train_step(config, params)
    state = {"params": params, "opt": opt_state}

    def our_step(batch):
        state["params"], state["opt"], loss = step(state["params"], state["opt"], batch)
        loss.block_until_ready()

    ours_pad = {**pad_masked, "positions_mlm": pad_masked["positions"]}
    del ours_pad["positions"], ours_pad["labels"]
    pack_masked = masked(pack, rng)  # its "positions" are the predictions'
    ours_pack = {**pack_masked, "positions_mlm": pack_masked["positions"]}
    ours_pack["positions"] = pack["positions"]  # the documents' rotary positions
    del ours_pack["labels"]
    results["train step: transformers padded"] = median_time(torch_step, args.rounds)
    results["train step: bertjax padded"] = median_time(lambda: our_step(ours_pad), args.rounds)
    results["train step: bertjax packed"] = median_time(lambda: our_step(ours_pack), args.rounds)

    print(
        f"\n{args.batch} texts of {args.seq // 4}..{args.seq} tokens ({real_tokens} real tokens; "
        f"{len(pack['input_ids'])} packed rows of {args.seq}), "
        f"L{args.layers}/H{args.hidden}/A{args.heads}, float32\n"
    )
    print(f"{'':<34}{'seconds':>10}{'tokens/s':>12}{'x transformers':>16}")
    for name, seconds in results.items():
        kind = name.split(":")[0]
        base = results[f"{kind}: transformers padded"]
        print(f"{name:<34}{seconds:>10.3f}{real_tokens / seconds:>12.0f}{base / seconds:>16.2f}")


def length_sweep(args) -> None:
    import torch

    print("\nforward of one text against its length (seconds; local layers: windows of 128)\n")
    columns = ("bertjax l+g", "bertjax global", "transformers l+g", "transformers global")
    print(f"{'length':>8}" + "".join(f"{c:>22}" for c in columns))
    sides = {every: hf_model(args, every) for every in (3, 1)}
    rng = np.random.default_rng(1)
    for length in args.lengths:
        ids = rng.integers(SEP + 1, VOCAB, (1, length)).astype(np.int32)
        batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        row = []
        for every in (3, 1):
            _, config, params = sides[every]
            forward = ours_forward(config, params)
            row.append(
                median_time(
                    lambda f=forward, p=params, b=batch: f(p, b).block_until_ready(), args.rounds
                )
            )
        for every in (3, 1):
            model = sides[every][0].eval()

            def run(model=model, batch=batch):
                with torch.no_grad():
                    model.model(**torch_inputs(batch))

            row.append(median_time(run, args.rounds))
        print(f"{length:>8}" + "".join(f"{t:>22.3f}" for t in row), flush=True)


def main() -> None:
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
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    device = jax.devices()[0].device_kind
    print(f"jax {jax.__version__} on {device}, torch {torch.__version__}, {os.cpu_count()} cores")
    compare_and_time(args)
    if not args.skip_sweep:
        length_sweep(args)


if __name__ == "__main__":
    main()
