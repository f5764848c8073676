"""Defaults shared by every recipe; each recipe file overrides what it changes.

Every field here is validated by `bertjax.pretrain.settings.PretrainSettings.from_config`
before anything is compiled, so a typo or an impossible value fails early with the field's
name.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0

    # The model: an encoder family ("bert" or "modernbert", bertjax.encoders), one of its
    # presets (bertjax/encoders/<family>/config.py's PRESETS) and overrides of its config's
    # fields (BertConfig, ModernBertConfig; ModernBERT reads hidden_dropout as its embedding
    # and feed-forward dropout). vocab_size 0 means "take it
    # from the tokenizer"; a non-zero value must match it.
    config.model = ml_collections.ConfigDict(
        dict(
            family="bert",
            preset="base",
            vocab_size=0,
            dtype="float32",  # compute dtype; bfloat16 on TPU/GPU
            # The matrix products' operand dtype (their sums in float32); unset: dtype.
            # "bfloat16" with dtype float32: bfloat16's speed on a CPU with AVX512-BF16.
            matmul_dtype=placeholder(str),
            attention_impl="auto",  # auto | xla | blocked | cudnn | splash
            remat_policy="none",  # none | full | dots
            scan_layers=False,
            hidden_dropout=0.1,
            attention_dropout=0.1,
        )
    )

    # Data: prepared by bertjax.data.prepare into data.dir when data.dir has no manifest.
    config.data = ml_collections.ConfigDict(
        dict(
            dir="",  # empty: <workdir>/data
            # Raw text files, globs or directories, comma-separated. With dir empty too: the
            # built-in demo corpus.
            input="",
            # A weighted mixture instead of input: "name=path[|path...]:weight[:option=value...]"
            # entries, comma-separated (options: format, text_field, id_field, max_epochs); each
            # source is prepared into its own directory under dir (docs/corpora.md).
            sources="",
            max_seq_length=128,
            max_predictions_per_seq=20,
            masked_lm_prob=0.15,  # of training batches (ModernBERT: 0.3)
            # Held-out batches are masked at this rate whatever training's, so that eval
            # losses of runs with different training rates compare.
            eval_masked_lm_prob=0.15,
            whole_word_masking=False,
            vocab_size=30000,  # for training a tokenizer when none is given
            tokenizer_model_type="unigram",  # unigram | bpe
            tokenizer="",  # an existing sentencepiece model to use instead
            lowercase=False,
            task="nsp",  # nsp | sop
            # "pairs": [CLS] A [SEP] B [SEP] instances; "packed": whole documents packed into
            # rows, each attending only to itself (objective "mlm" only; dupe_factor 1).
            layout="pairs",
            dupe_factor=5,
            short_seq_prob=0.1,
            eval_fraction=0.01,
            workers=0,  # 0: one per CPU core
        )
    )

    # What a step minimises, a registered objective (bertjax.pretrain.objectives):
    # "mlm_sentence" (masked LM + the sentence-pair task of data.task) or "mlm" (masked LM
    # only; the pooler and the pair head are not trained) or "rtd" (replaced-token detection,
    # ELECTRA: model.family "electra"; its masking is ELECTRA's, docs/electra.md) or "distill"
    # (the masked LM learned from a teacher too, DistilBERT: docs/distillation.md).
    config.objective = "mlm_sentence"
    # rtd only: the generator's hidden size as a fraction of the discriminator's (ELECTRA's
    # 1/4 for base and large), and the weight (lambda) of the discriminator's loss.
    config.generator_hidden_fraction = 0.25
    config.rtd_weight = 50.0
    # distill only (DistilBERT): the teacher, a pretraining run or transformers directory whose
    # tokenizer the run takes; both networks' masked-LM distributions softened at
    # distill_temperature; the weights of the soft cross-entropy, the masked LM and the
    # hidden states' cosine; the teacher's layers the student starts from ("0,2,4,6,8,10").
    config.teacher = ""
    config.distill_temperature = 2.0
    config.distill_weights = "5,2,1"
    config.distill_student_layers = ""

    # Optimizer and schedule: the fields of bertjax.engine.optim.OptimizerSettings.
    config.optimizer = ml_collections.ConfigDict(
        dict(
            name="adamw",  # adamw | lamb | stable_adamw
            learning_rate=1e-4,
            warmup_steps=10_000,
            schedule="linear",
            end_learning_rate=0.0,
            polynomial_power=0.5,
            decay_steps=0,  # schedule "wsd": steps of the final 1 - sqrt decay
            weight_decay=0.01,
            lr_decoupled_weight_decay=False,
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            max_grad_norm=1.0,
        )
    )

    config.num_train_steps = 1_000_000
    config.batch_size = 256  # global, over all processes and devices
    config.grad_accum_steps = 1  # micro-batches per step; batch_size must divide evenly
    # Batch-size warmup (ModernBERT's): the global batch starts at batch_warmup_start rows and
    # grows in steps of that size to batch_size over the first batch_warmup_steps steps.
    # 0 steps: the full batch from the start.
    config.batch_warmup_start = 0
    config.batch_warmup_steps = 0
    # Skip padding in the encoder: the real tokens of each batch shard are packed into this
    # fraction of its token slots. A micro-batch with more real tokens than fit runs
    # unpacked, so the value changes speed, not results (dropout draws aside); a value just
    # above the data's fill (real tokens / slots) saves the most, and train/packed logs the
    # share of micro-batches that fit. 1.0 turns packing off.
    config.token_capacity = 1.0

    # Device mesh (data, fsdp, tensor); one -1 takes the remaining devices.
    config.mesh_shape = (-1, 1, 1)

    config.log_every_steps = 100
    config.eval_every_steps = 10_000
    config.eval_batches = 100  # 0: the whole eval split
    config.checkpoint_every_steps = 10_000
    config.keep_checkpoints = 3
    # A workdir or checkpoint dir whose params start the run (with a fresh optimizer);
    # a recipe that needs one sets it to None, which validation reports as missing.
    config.init_from = ""
    config.peak_flops_per_device = 0.0  # 0: look up the device in bertjax.engine.perf's table
    # At the end, show what the model guesses for a word hidden in this many held-out sentences.
    config.fill_mask_samples = 4
    return config
