"""Inference throughput: bertjax.Model beside transformers (torch) on the same model and inputs.

    python benchmarks/infer.py [--sentences 10000] [--fill_mask 1000] [--batch_size 32]

Embeds `--sentences` sentences (mean pooling) and fills one [MASK] in each of `--fill_mask`
sentences, on CPU, with a BERT-small-sized model (L4/H512/A8) of random weights and a
sentencepiece tokenizer trained here on the demo corpus (the interpreter's documentation).
The model is written with `Model.save_hf`, and transformers reads that directory: the same
weights, the same token ids. transformers runs as its users run it: batches of
`--batch_size` in input order, padded to their longest text (its fill-mask pipeline with
batch_size; its BertModel for embeddings). As a reference it also runs on batches sorted by
length, which is where much of bertjax's advantage comes from.

Outputs are checked to agree within 1e-4 (embeddings; fill-mask scores, with the same top-5
tokens) on the texts that transformers tokenizes exactly as bertjax does; the count of those
that it does not (a unigram tokenizer's float32 ties, see bertjax/tokenizer.py) is printed.

Times are the best of `--repeats` runs after a warm-up: for bertjax a whole call, which
compiles every bucket (its time, compilation included, is printed as "first call"), for
torch a few batches.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bertjax import Model  # noqa: E402
from bertjax.data import demo_corpus_path  # noqa: E402
from bertjax.model import BertConfig, BertForPreTraining  # noqa: E402
from bertjax.tokenizer import MODEL_TYPES, TokenizerSettings, train_tokenizer  # noqa: E402

TOLERANCE = 1e-4


def read_sentences(work_dir: pathlib.Path) -> list[str]:
    """The demo corpus's sentences (one per line), in file order."""
    path = demo_corpus_path(work_dir / "corpus")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def random_params(config: BertConfig, seed: int):
    """Every parameter random (std 0.05, LayerNorm scales near 1): predictions peaked enough
    that the top-5 order is not decided by rounding, as at init's 0.02, without the
    near-one-hot attention that larger weights give at this width (where float rounding
    would flip which key wins)."""
    model = BertForPreTraining(config)
    abstract = jax.eval_shape(
        lambda key: model.init(key, jnp.zeros((1, 1), jnp.int32))["params"], jax.random.key(0)
    )
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        noise = rng.normal(0, 0.05, leaf.value.shape).astype(np.float32)
        is_scale = any(getattr(k, "key", None) == "scale" for k in path)
        return (1.0 + noise) if is_scale else noise

    return jax.tree.map_with_path(
        fill, abstract, is_leaf=lambda x: hasattr(x, "value") and hasattr(x, "names")
    )


def masked(sentences: list[str]) -> list[str]:
    """Each sentence with its middle word replaced by [MASK]."""
    out = []
    for sentence in sentences:
        words = sentence.split()
        words[len(words) // 2] = "[MASK]"
        out.append(" ".join(words))
    return out


def best_time(function, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def torch_embed(model, tokenizer, texts, batch_size, sort):
    """Mean-pooled embeddings as a transformers user computes them, batch by batch."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if sort else range(len(texts))
    order = list(order)
    out = np.zeros((len(texts), model.config.hidden_size), np.float32)
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            inputs = tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=model.config.max_position_embeddings,
                return_tensors="pt",
            )
            hidden = model(**inputs).last_hidden_state
            mask = inputs["attention_mask"][..., None].to(hidden.dtype)
            out[rows] = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    return out


def same_tokens(tokenizer, hf_tokenizer, texts) -> np.ndarray:
    """[n] bool: transformers (reading the export's tokenizer.json) gives bertjax's token ids.

    Outputs are compared on these texts only; the others are unigram's float32 ties (runs of
    one repeated character, see bertjax/tokenizer.py), where the inputs themselves differ.
    """
    ours = tokenizer.encode_batch(texts, special_tokens_in_text=True)
    theirs = hf_tokenizer(texts, add_special_tokens=False)["input_ids"]
    return np.asarray([a == b for a, b in zip(ours, theirs)])


def compare_fill_mask(ours, theirs) -> tuple[int, float]:
    """Texts whose top-5 tokens differ, and the largest score difference where they agree."""
    differ, worst = 0, 0.0
    for a, b in zip(ours, theirs):
        if [p["token"] for p in a] != [p["token"] for p in b]:
            differ += 1
            continue
        worst = max(worst, max(abs(p["score"] - q["score"]) for p, q in zip(a, b)))
    return differ, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=10_000)
    parser.add_argument("--fill_mask", type=int, default=1_000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--tokenizer", choices=MODEL_TYPES, default="unigram")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--sorted_reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time transformers on length-sorted batches",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--work_dir", default="runs/bench_infer")
    args = parser.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    work = pathlib.Path(args.work_dir)
    sentences = read_sentences(work)
    rng = np.random.default_rng(0)
    texts = [sentences[i] for i in rng.choice(len(sentences), args.sentences, replace=False)]
    fill_texts = masked(
        [s for s in texts if len(s.split()) >= 3][: args.fill_mask]
    )  # every text has a word to hide
    print(
        f"{len(texts)} sentences to embed (mean {np.mean([len(t) for t in texts]):.0f} chars), "
        f"{len(fill_texts)} to fill; batch {args.batch_size}; {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads, jax {jax.__version__}"
    )

    tokenizer = train_tokenizer(
        sentences,
        TokenizerSettings(vocab_size=args.vocab_size, model_type=args.tokenizer),
        work / "tokenizer.model",
    )
    config = BertConfig.preset(
        "small", vocab_size=tokenizer.vocab_size, max_position_embeddings=512
    )
    model = Model(
        config, random_params(config, seed=0), tokenizer, batch_size=args.batch_size, progress=False
    )
    export = work / "hf"
    model.save_hf(export)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    hf_encoder = transformers.BertModel.from_pretrained(export, add_pooling_layer=False).eval()
    pipe = transformers.pipeline("fill-mask", model=str(export), device="cpu")
    lengths = [len(ids) + 2 for ids in tokenizer.encode_batch(texts)]
    same_ids = same_tokens(tokenizer, hf_tokenizer, texts)
    print(
        f"model {config.num_layers} layers, hidden {config.hidden_size}, vocabulary "
        f"{config.vocab_size}; {np.mean(lengths):.1f} tokens per sentence on average "
        f"(max {max(lengths)})\n"
    )

    rows = []

    def run(task, name, count, function, warm_up):
        """Times a warm-up call, then `repeats` calls; records the best and the first."""
        start = time.perf_counter()
        warm_up()
        first = time.perf_counter() - start
        seconds, result = best_time(function, args.repeats)
        rows.append((task, name, count / seconds, count / first if warm_up is function else None))
        return result

    # bertjax's warm-up is the whole call (it compiles each bucket: "first call" includes
    # compilation); torch's a few batches.
    embed = lambda: model.embed(texts)  # noqa: E731
    ours = run("embed", "bertjax", len(texts), embed, embed)
    few = texts[: 2 * args.batch_size]
    theirs = run(
        "embed",
        "transformers",
        len(texts),
        lambda: torch_embed(hf_encoder, hf_tokenizer, texts, args.batch_size, sort=False),
        lambda: torch_embed(hf_encoder, hf_tokenizer, few, args.batch_size, sort=False),
    )
    if args.sorted_reference:
        run(
            "embed",
            "transformers, sorted",
            len(texts),
            lambda: torch_embed(hf_encoder, hf_tokenizer, texts, args.batch_size, sort=True),
            lambda: None,
        )
    embed_error = float(np.max(np.abs(ours - theirs)[same_ids]))

    fill = lambda: model.fill_mask(fill_texts)  # noqa: E731
    ours_fill = run("fill-mask", "bertjax", len(fill_texts), fill, fill)
    theirs_fill = run(
        "fill-mask",
        "transformers",
        len(fill_texts),
        lambda: pipe(fill_texts, batch_size=args.batch_size, top_k=5),
        lambda: pipe(fill_texts[: 2 * args.batch_size], batch_size=args.batch_size, top_k=5),
    )
    fill_same = same_tokens(tokenizer, hf_tokenizer, fill_texts)
    differ, score_error = compare_fill_mask(
        [r for r, same in zip(ours_fill, fill_same) if same],
        [r for r, same in zip(theirs_fill, fill_same) if same],
    )

    print(f"{'task':<10} {'implementation':<22} {'sentences/s':>12} {'first call':>11}")
    for task, name, rate, first_rate in rows:
        first = "" if first_rate is None else f"{first_rate:.1f}"
        print(f"{task:<10} {name:<22} {rate:>12.1f} {first:>11}")
    by = {(task, name): rate for task, name, rate, _ in rows}
    for task in ("embed", "fill-mask"):
        ratio = by[(task, "bertjax")] / by[(task, "transformers")]
        print(f"{task}: bertjax / transformers = {ratio:.2f}x")
    print(
        f"\ntoken ids: transformers gives bertjax's for {same_ids.sum()} of {len(texts)} "
        f"texts to embed and {fill_same.sum()} of {len(fill_texts)} to fill; outputs are "
        "compared on those"
    )
    print(
        f"embeddings: max |difference| {embed_error:.2e} "
        f"({'within' if embed_error <= TOLERANCE else 'OVER'} {TOLERANCE})"
    )
    print(
        f"fill-mask: {differ} of {fill_same.sum()} texts with other top-5 tokens; max score "
        f"difference {score_error:.2e} ({'within' if score_error <= TOLERANCE else 'OVER'} "
        f"{TOLERANCE})"
    )


if __name__ == "__main__":
    main()
