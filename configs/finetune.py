"""Fine-tune a pretrained BERT: google-research/bert's run_classifier defaults.

    python finetune.py --workdir runs/sst2 --config.init_from=runs/tiny \
        --config.data.glue_task=sst2 --config.data.dir=glue/SST-2

    python finetune.py --workdir runs/reviews --config.init_from=runs/tiny \
        --config.task=classification --config.data.train=train.csv \
        --config.data.validation=dev.csv --config.data.text_fields=review \
        --config.data.label_field=stars

Every field is validated by `bertjax.finetune.settings.FinetuneSettings.from_config` before
any data is read or anything is compiled.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    # The model to fine-tune: a bertjax work directory (its latest checkpoint), a directory
    # written by Model.save_hf, or a Hugging Face BERT directory with its tokenizer. Required.
    config.init_from = ""
    # classification | regression | multi_label | token_classification | question_answering |
    # seq2seq | embedding; may stay empty with data.glue_task, which implies it.
    config.task = ""

    config.data = ml_collections.ConfigDict(
        dict(
            # Your own files: CSV, TSV (both with a header row), JSON Lines, or for
            # token_classification CoNLL-style `token TAG` lines with blank lines between
            # sentences. The test file may lack labels; predictions are written for it.
            train="",
            validation="",
            test="",
            format="",  # csv | tsv | jsonl | conll; empty: by each file's extension
            text_fields="sentence",  # one field, or two for pairs: "sentence1,sentence2"
            label_field="label",
            # multi_label: labels are a JSON list, or a string split at this separator.
            label_separator="",
            # Or a GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli) read from
            # its directory of the standard download: its labels and metric come with it.
            glue_task="",
            dir="",
            # Unset: 128, or the task's own (question_answering: 384, run_squad.py's).
            max_seq_length=placeholder(int),
            # seq2seq: the source and target text fields, the source's tokens ([CLS] and
            # [SEP] included; 0: max_seq_length) and the target's ([SEP] included).
            source_field="source",
            target_field="target",
            max_source_length=0,
            max_target_length=64,
            # Distillation only: examples without labels, in the training file's format,
            # which the student learns from the teacher alone (config.distill).
            unlabeled="",
        )
    )
    # Distillation (bertjax/finetune/distill.py): the model learns from a teacher fine-tuned
    # on the same task and labels, with the same tokenizer (a bertjax run or a transformers
    # directory), besides the labels: (1 - alpha) * the task's loss + alpha * its soft loss
    # against the teacher's outputs softened by temperature. student_layers ("0,2,4")
    # starts the model as the teacher with only those layers, in place of init_from.
    config.distill = ml_collections.ConfigDict(
        dict(teacher="", alpha=0.5, temperature=2.0, student_layers="")
    )
    # seq2seq (an encoder-decoder warm-started from init_from, Rothe et al. 2020): init is
    # bert2bert | bertshare | bert2rnd | rnd2rnd; evaluation generates greedily (num_beams
    # 1) or by beam search, at most max_new_tokens (0: data.max_target_length) tokens.
    config.seq2seq = ml_collections.ConfigDict(
        dict(
            init="bert2bert",
            label_smoothing=0.0,
            num_beams=1,
            max_new_tokens=0,
            length_penalty=1.0,
            no_repeat_ngram_size=0,
        )
    )
    # task=embedding (a bi-encoder; see bertjax/tasks/embed/task.py). Its files:
    # data.text_fields="anchor,positive" or "anchor,positive,negative" (with
    # loss=cosine_regression: two fields and data.label_field, the gold score); the
    # validation file holds scored pairs (the first two text fields and data.label_field).
    config.embedding = ml_collections.ConfigDict(
        dict(
            pooling="mean",  # mean | cls | max, of the encoder's outputs over the text's tokens
            normalize=False,  # unit-length vectors
            loss="in_batch_negatives",  # or cosine_regression (scored pairs)
            scale=20.0,  # in_batch_negatives: inverse temperature of the softmax
            symmetric=False,  # in_batch_negatives: also each positive against every anchor
            score_max=1.0,  # cosine_regression: gold scores are divided by it (5 for STS-B)
            # Optional retrieval evaluation, TSV without a header: `id<TAB>text` queries and
            # corpus, `query_id<TAB>doc_id` relevance (config.metric may then be ndcg@10, ...).
            queries="",
            corpus="",
            relevance="",
        )
    )
    # question_answering (SQuAD v1.1/v2.0 JSON or JSON Lines in data.train etc.): google's
    # run_squad.py windowing and decoding. With config.task=question_answering, unset
    # learning_rate, num_epochs and data.max_seq_length are run_squad.py's (3e-5, 2, 384).
    config.qa = ml_collections.ConfigDict(
        dict(
            doc_stride=128,  # tokens from one window's start to the next one's
            max_query_length=64,  # question tokens kept
            n_best_size=20,
            max_answer_length=30,  # tokens
            null_score_diff_threshold=0.0,  # v2.0: predict "" above this null - best score
            # True / False; unset: as the data says (SQuAD v2.0's is_impossible)
            version_2_with_negative=placeholder(bool),
        )
    )
    # BertConfig fields a run may change; the architecture comes from init_from.
    config.model = ml_collections.ConfigDict(
        dict(
            dtype="float32",  # compute dtype; bfloat16 on TPU/GPU
            # The matrix products' operand dtype (their sums in float32); unset: dtype.
            # "bfloat16" with dtype float32: bfloat16's speed on a CPU with AVX512-BF16.
            matmul_dtype=placeholder(str),
            attention_impl="auto",
            remat_policy="none",
            # Unset: the encoder family's fine-tuning dropout: BERT's and ELECTRA's 0.1
            # (google's), ModernBERT's the checkpoint's own (0.0 in AnswerDotAI's), as
            # transformers' ModernBertFor* classes train it.
            hidden_dropout=placeholder(float),
            attention_dropout=placeholder(float),
        )
    )
    # AdamW with BERT's weight-decay mask; linear warmup over warmup_fraction of the steps,
    # then linear decay to 0.
    config.optimizer = ml_collections.ConfigDict(
        dict(
            learning_rate=placeholder(float),  # unset: 2e-5, or the task's (QA: 3e-5)
            warmup_fraction=0.1,
            weight_decay=0.01,
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            max_grad_norm=1.0,
        )
    )
    # Evaluated on data.validation after each one. Unset: 3, or the task's (QA: 2).
    config.num_epochs = placeholder(int)
    config.batch_size = 32  # global, over all processes and devices
    config.grad_accum_steps = 1
    config.eval_batch_size = 64
    # One run per seed (--config.seeds=1,2,3): each in <workdir>/seed_<n>, and the median of
    # the best validation metric over them, as GLUE papers report.
    config.seeds = (1,)
    # The metric that picks the best checkpoint; empty: the task's (GLUE's) own. seq2seq:
    # bleu (default) | rouge1 | rouge2 | rougeL | exact_match.
    config.metric = ""
    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); one -1 takes the remaining devices
    # Token packing (see default.py): the encoder skips padding. 0 chooses the packed slots
    # from the training data, just enough for the fullest batch of the run; 1 turns packing
    # off; a value in between is a fraction of the slots, as in pretraining.
    config.token_capacity = 0.0
    # Each training batch is cut to a multiple of this many positions that holds its longest
    # example, so short texts do not pay for max_seq_length: the narrowest of a few such widths
    # chosen from the run's lengths (one compile each, within 2 % more positions than every
    # multiple; evaluation's within 5 %, multiples of a quarter of it: docs/compiling.md).
    # 0 pads every batch to max_seq_length.
    config.length_bucket = 32
    # With grad_accum_steps > 1 each batch is sorted by length and run as micro-batches of
    # similar length, each cut to its own length bucket: the update is the one-batch update
    # (gradients summed exactly), and short examples stop paying for the batch's longest. On
    # long, uneven inputs (SQuAD's windows) this is the fast path: see benchmarks/qa.py.
    config.group_by_length = True
    # "shuffled": each batch a random draw from the epoch (google's run_classifier).
    # "by_length": batches of examples of similar length, as Hugging Face's group_by_length
    # sampler makes them (each window of 50 batches of the random order sorted by length, the
    # batches' order shuffled), so a batch pays little padding: on texts of uneven length the
    # fast setting (docs/finetuning.md). The batches hold other examples together than
    # shuffled's, so the run differs from it; a run resumes only with the order it began.
    config.batch_order = "shuffled"
    # A fresh regression head's bias starts at the mean of the training targets ("mean"), so the
    # encoder need not learn the targets' offset: Adam moves the bias by about the learning rate
    # per step, too little to reach targets like STS-B's 0-5 in a few hundred steps at 2e-5.
    # "zero" is google's and transformers' start (benchmarks/finetune_parity.py compares both).
    config.regression_bias_init = "mean"
    # Threads that lower and compile (or load from the compilation cache) the run's programs,
    # every training and evaluation width, known before the first step, while it trains; 0
    # compiles each when a step first meets its shape. One thread measured 1.00-1.10x faster
    # whole commands on an idle 2-core host (docs/compiling.md); on an accelerator host the
    # device trains while the host compiles.
    config.compile_ahead = 1
    config.log_every_steps = 50
    # The latest state is also saved after every epoch; rerunning the command resumes.
    config.checkpoint_every_steps = 1000
    return config
