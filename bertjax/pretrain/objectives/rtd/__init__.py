"""`rtd`: replaced-token detection (ELECTRA), on any encoder family with a generator
(EncoderFamily.generator: ELECTRA and ModernBERT).

    objective.py  what a step computes (RtdLoss)
    model.py      the two networks, built from what every family offers
    replaced.py   Model.replaced, the discriminator's marks on texts

This module is what a run asks of the objective (bertjax.pretrain.objectives): its checks,
masking, networks, FLOPs, baselines, cautions and samples, and how a run it trained opens:
"" the discriminator and "generator" the generator, each a model of the run's family
(bertjax.engine.networks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import encoders
from bertjax.data import baseline
from bertjax.data.masking import MaskingSettings, RowRandom, mask_batch
from bertjax.engine import networks as networks_lib
from bertjax.engine import steps
from bertjax.pretrain import samples as samples_lib
from bertjax.pretrain.objectives.base import PretrainObjective, require
from bertjax.pretrain.objectives.rtd import model as rtd_model
from bertjax.pretrain.objectives.rtd.objective import (
    RtdLoss,
    RtdSettings,
    gumbel_sample,
    num_slots,
)
from bertjax.pretrain.objectives.rtd.replaced import replaced
from bertjax.storage import hf

# ELECTRA's fates of a masked position: [MASK] 85%, kept 15%, never a random token
# (google-research/electra pretrain_helpers.mask).
MASK_TOKEN_PROB = 0.85
# A generator that predicts more than this share of the masked tokens replaces few of them, and
# only with what it finds plausible: the discriminator's task becomes too hard and its recall
# on replaced tokens collapses (the ELECTRA paper's case against generators as large as the
# discriminator). Each evaluation past it logs a warning (docs/electra.md).
GENERATOR_TOO_STRONG = 0.75


class ReplacedTokenDetectionObjective(PretrainObjective):
    name = "rtd"
    samples_title = (
        "Held-out text as the discriminator saw it ([drawn/original] where the generator "
        "replaced a token, *p where the discriminator calls it replaced):"
    )

    fields = {
        "generator_hidden_fraction": RtdSettings.generator_hidden_fraction,
        "rtd_weight": RtdSettings.weight,
    }

    notebook = {"replaced": replaced}

    def check(self, values, family: Any, layout: str) -> None:
        able = [f.name for f in encoders.FAMILIES if f.generator is not None]
        require(
            values,
            family.generator is not None,
            "objective",
            f"replaced-token detection runs on a family with a generator "
            f"(config.model.family one of {able}), not {family.name!r}",
        )
        fraction = values["generator_hidden_fraction"]
        require(
            values,
            isinstance(fraction, (int, float)) and 0 < fraction <= 1,
            "generator_hidden_fraction",
            "must be in (0, 1] (ELECTRA: 0.25 for base and large, 1.0 for the released Small)",
        )
        weight = values["rtd_weight"]
        require(
            values,
            isinstance(weight, (int, float)) and weight > 0,
            "rtd_weight",
            "must be > 0 (ELECTRA's lambda: 50)",
        )

    def read(self, values) -> RtdSettings:
        return RtdSettings(
            generator_hidden_fraction=float(values["generator_hidden_fraction"]),
            weight=float(values["rtd_weight"]),
        )

    def masking(self, masking: MaskingSettings, max_seq_length: int) -> MaskingSettings:
        """ELECTRA's: N = int((p + 0.005) * S) slots per row, 85% [MASK], 15% kept."""
        return dataclasses.replace(
            masking,
            max_predictions_per_seq=num_slots(masking.masked_lm_prob, max_seq_length),
            mask_token_prob=MASK_TOKEN_PROB,
            random_token_prob=0.0,
        )

    def frozen(self, family: Any, model_config: Any, options: Any = None) -> tuple[str, ...]:
        """The discriminator's encoder's pooled output, which it never computes (AdamW's
        decay would shrink it otherwise)."""
        return networks_lib.pooled_output_layers(model_config)

    def model_init(self, family: Any, model_config: Any, options: RtdSettings):
        return rtd_model.init(model_config, options.generator_hidden_fraction)

    def step(self, family: Any, model_config: Any, settings: Any) -> steps.Loss:
        options = settings.objective_settings
        model = rtd_model.ReplacedTokenDetection(model_config, options.generator_hidden_fraction)
        return RtdLoss(model, options.weight)

    def baselines(self, settings, data_dir, eval_metrics=None) -> dict[str, float]:
        """The generator's against the unigram guess; the discriminator's against calling
        every token original (measured on the same eval batches) and its AUC against chance."""
        unigram = baseline.unigram_baseline(
            data_dir,
            masking=settings.data.eval_masking,
            seed=settings.run.seed,
            batch_size=settings.run.micro_batch_size,
            max_batches=settings.run.eval_batches,
        )
        out = {"eval/generator_accuracy": unigram.accuracy}
        if eval_metrics and "eval/all_original_accuracy" in eval_metrics:
            out["eval/discriminator_accuracy"] = eval_metrics["eval/all_original_accuracy"]
        # Scores that tell nothing apart rank a replaced token above an original half the time.
        out["eval/replaced_auc"] = 0.5
        return out

    def cautions(self, eval_metrics) -> list[str]:
        accuracy = eval_metrics.get("eval/generator_accuracy")
        if accuracy is None or accuracy <= GENERATOR_TOO_STRONG:
            return []
        return [
            f"the generator predicts {accuracy:.1%} of the masked tokens (above "
            f"{GENERATOR_TOO_STRONG:.0%}): it replaces few of them, so the discriminator's "
            "task gets too hard and its recall on replaced tokens collapses; use a smaller "
            "generator (config.generator_hidden_fraction, ELECTRA: 1/4 to 1/2)"
        ]

    def flops(self, family, model_config, seq_len: int, predictions: int, options=None) -> float:
        """Both networks (rtd.model.flops)."""
        fraction = (options or RtdSettings()).generator_hidden_fraction
        return rtd_model.flops(model_config, fraction, seq_len, predictions)

    def samples(
        self, model_config, params, tokenizer, data_dir, count, mesh, options=None
    ) -> list[str]:
        texts = samples_lib.held_out_texts(data_dir, tokenizer, count)
        fraction = (options or RtdSettings()).generator_hidden_fraction
        return corrupted_samples(model_config, fraction, params, tokenizer, texts, mesh)

    def networks(self, config, params, meta) -> dict[str, networks_lib.Network]:
        """The discriminator ("", the family's pretraining tree with its replaced-token head;
        its masked-LM head and its encoder's pooled output untrained) and the generator
        ("generator", a masked LM of the family reading the discriminator's embeddings),
        each with what it lacks of the family's tree freshly made."""
        options = self.options(meta.get("config") or {})
        generator = encoders.family_of(config).generator(config, options.generator_hidden_fraction)
        own = params[rtd_model.GENERATOR]
        discriminator = {
            name: value for name, value in params.items() if name != rtd_model.GENERATOR
        }
        return {
            "": networks_lib.family_model(config, discriminator, untrained=(hf.POOLER,)),
            rtd_model.GENERATOR: networks_lib.family_model(
                generator.config,
                generator.pretraining_params(own, params[rtd_model.ENCODER]),
            ),
        }


def corrupted_samples(config, fraction, params, tokenizer, texts, mesh):
    """Lines showing, per held-out text, the generator's replacements ([drawn/was]) and the
    discriminator's marks (a * after each token it calls replaced, with its probability)."""
    if not texts:
        return []
    ids = [
        [tokenizer.cls_id, *tokenizer.encode(t)[: config.max_position_embeddings - 2]]
        + [tokenizer.sep_id]
        for t in texts
    ]
    length = max(map(len, ids))
    input_ids = np.zeros((len(ids), length), np.int32)  # [n, s]
    for row, piece_ids in enumerate(ids):
        input_ids[row, : len(piece_ids)] = piece_ids
    input_mask = (input_ids != 0).astype(np.int32)  # [n, s]
    masking = MaskingSettings(
        masked_lm_prob=0.15,
        max_predictions_per_seq=max(1, num_slots(0.15, length)),
        mask_token_prob=MASK_TOKEN_PROB,
        random_token_prob=0.0,
    )
    masked = mask_batch(
        input_ids,
        input_mask,
        RowRandom(np.arange(len(ids))),
        masking,
        vocab_size=tokenizer.vocab_size,
        special_ids=tokenizer.special_ids,
        mask_id=tokenizer.mask_id,
    )
    model = rtd_model.ReplacedTokenDetection(config, fraction)

    @jax.jit
    def run(params, masked_ids, positions, weights, mask):
        logits = model.apply(
            {"params": params},
            masked_ids,
            None,
            mask,
            positions,
            deterministic=True,
            method="generator_logits",
        )  # [n, p, v]
        drawn = gumbel_sample(logits, jax.random.key(0))  # [n, p]
        current = jnp.take_along_axis(masked_ids, positions, axis=1)  # [n, p]
        rows = jnp.arange(masked_ids.shape[0])[:, None]  # [n, 1]
        corrupted = masked_ids.at[rows, positions].set(jnp.where(weights > 0, drawn, current))
        scores = jax.nn.sigmoid(
            model.apply(
                {"params": params},
                corrupted,
                None,
                mask,
                method="replaced_logits",
            )
        )  # [n, s]
        return corrupted, scores

    with jax.set_mesh(mesh):
        corrupted, scores = jax.device_get(
            run(
                params,
                masked["input_ids"],
                masked["masked_lm_positions"],
                masked["masked_lm_weights"],
                input_mask,
            )
        )
    lines = []
    for row, piece_ids in enumerate(ids):
        shown = []
        for position in range(1, len(piece_ids) - 1):
            token, was = int(corrupted[row, position]), int(input_ids[row, position])
            piece = tokenizer.id_to_piece(token)
            if token != was:
                piece = f"[{piece}/{tokenizer.id_to_piece(was)}]"
            if scores[row, position] > 0.5:
                piece += f"*{scores[row, position]:.2f}"
            shown.append(piece)
        lines.append(" ".join(shown))
    return lines


OBJECTIVE = ReplacedTokenDetectionObjective()
