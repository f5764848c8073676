"""`distill`: the masked LM learned from a frozen teacher as well as from the data (DistilBERT).

loss.py says what a step computes. The student is any family's masked-LM model (config.model);
the teacher (config.teacher) a pretraining run or a transformers directory of any family
whose tokenizer is the run's and whose hidden states are as wide as the student's. The
teacher never trains and is never saved with the run: its masked-LM logits and last hidden
states are computed on the student's mesh for every batch (bertjax.engine.teacher).
config.distill_student_layers starts the student as the teacher's layers (DistilBERT took
every other layer of BERT-base); without it the student starts at random (or config.init_from).
A run of this objective opens as an ordinary model of the student's family.
"""

from __future__ import annotations

from typing import Any

import jax

from bertjax import encoders
from bertjax.engine import perf, rundir, steps
from bertjax.engine import teacher as teacher_lib
from bertjax.engine.settings import ConfigError
from bertjax.pretrain.objectives.base import require
from bertjax.pretrain.objectives.distill.loss import DistillLoss, DistillSettings
from bertjax.pretrain.objectives.mlm import Mlm
from bertjax.storage import fs
from bertjax.text.tokenizer import HF_TOKENIZER_FILE, Tokenizer

__all__ = ["OBJECTIVE", "DistillLoss", "DistillSettings"]

_DEFAULTS = DistillSettings()


def _layers(value: Any) -> tuple[int, ...]:
    """ "0,2,4" (or ints) as increasing layer indices; "" as none."""
    if value in (None, "", ()):
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        layers = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        raise ValueError("must be layer indices, e.g. 0,2,4") from None
    if any(layer < 0 for layer in layers) or list(layers) != sorted(set(layers)):
        raise ValueError("must be distinct layer indices >= 0 in increasing order, e.g. 0,2,4")
    return layers


class Distillation(Mlm):
    name = "distill"
    samples_title = "Fill-mask on held-out text by the student (top 3):"

    fields = {
        "teacher": _DEFAULTS.teacher,
        "distill_temperature": _DEFAULTS.temperature,
        "distill_weights": "5,2,1",
        "distill_student_layers": "",
    }

    def check(self, values, family: Any, layout: str) -> None:
        teacher = values["teacher"]
        require(
            values,
            isinstance(teacher, str) and bool(teacher),
            "teacher",
            "set it to the teacher: a pretraining run's work directory or a transformers "
            "directory whose tokenizer is this run's",
        )
        require(values, fs.kind(teacher) == "directory", "teacher", "no such directory")
        temperature = values["distill_temperature"]
        require(
            values,
            isinstance(temperature, (int, float)) and 0 < temperature <= 100,
            "distill_temperature",
            "must be in (0, 100] (DistilBERT: 2)",
        )
        require(
            values,
            _weights(values["distill_weights"]) is not None,
            "distill_weights",
            "must be three weights >= 0, not all 0, of the soft cross-entropy, the masked LM "
            "and the hidden states' cosine (DistilBERT: 5,2,1)",
        )
        try:
            _layers(values["distill_student_layers"])
        except ValueError as err:
            require(values, False, "distill_student_layers", str(err))

    def read(self, values) -> DistillSettings:
        ce, mlm, cos = _weights(values["distill_weights"])
        return DistillSettings(
            teacher=str(values["teacher"]),
            temperature=float(values["distill_temperature"]),
            alpha_ce=ce,
            alpha_mlm=mlm,
            alpha_cos=cos,
            student_layers=_layers(values["distill_student_layers"]),
        )

    def step(self, family: Any, model_config: Any, settings: Any) -> steps.Loss:
        return DistillLoss(family.pretraining_model(model_config), settings.objective_settings)

    def tokenizer_from(self, options: DistillSettings) -> fs.AnyPath | None:
        """The teacher's tokenizer: a run's sentencepiece model, or a transformers
        directory's tokenizer.json."""
        trained = rundir.trained_tokenizer(options.teacher)
        if trained is not None:
            return trained
        candidate = fs.path(options.teacher) / HF_TOKENIZER_FILE
        return candidate if fs.kind(candidate) == "file" else None

    def batch_features(
        self, model_config: Any, options: DistillSettings, tokenizer: Tokenizer, built: steps.Steps
    ) -> teacher_lib.TeacherOutputs:
        """The teacher's masked-LM logits and last hidden states on every batch."""
        teacher = _open(options.teacher)
        field = f"config.teacher={options.teacher!r}"
        if teacher.tokenizer.fingerprint != tokenizer.fingerprint:
            raise ConfigError(
                f"{field}: its tokenizer ({teacher.tokenizer.vocab_size} pieces) is not the "
                f"run's ({tokenizer.vocab_size} pieces); distillation compares the two networks "
                "position by position, so both read text with one tokenizer (leave "
                "config.data.tokenizer unset to take the teacher's)"
            )
        if teacher.config.hidden_size != model_config.hidden_size:
            raise ConfigError(
                f"{field}: its hidden states are {teacher.config.hidden_size} wide, the "
                f"student's (config.model) {model_config.hidden_size}; the cosine term compares "
                "them coordinate by coordinate, so both must be as wide"
            )
        model = encoders.family_of(teacher.config).pretraining_model(teacher.config)

        def outputs(params, batch):
            output = model.apply(
                {"params": params},
                batch["input_ids"],
                batch["segment_ids"],
                batch["input_mask"],
                batch["masked_lm_positions"],
                deterministic=True,
                document_ids=batch.get("document_ids"),
                positions=batch.get("positions"),
            )
            return {"mlm_logits": output.mlm_logits, "hidden": output.sequence_output}

        _, params = rundir.read_params(teacher, built.mesh)
        layout = steps.make_state(
            encoders.family_of(teacher.config).pretraining_init(teacher.config), None, built.mesh
        )
        params = jax.device_put(params, layout.shardings.params)
        return teacher_lib.frozen_outputs(outputs, params, built)

    def initial_params(self, model_config: Any, options: DistillSettings, abstract_params: Any):
        """With distill_student_layers, the teacher's chosen layers (its embeddings and
        masked-LM head too), placed as `abstract_params` (the student's) says."""
        if not options.student_layers:
            return None
        teacher = _open(options.teacher)
        mesh = jax.tree.leaves(abstract_params)[0].sharding.mesh
        student = teacher_lib.keep_layers(
            teacher, options.student_layers, "distill_student_layers", mesh
        )
        _, params = rundir.read_params(student)
        shapes = jax.tree.map(lambda x: tuple(x.shape), abstract_params)
        found = jax.tree.map(lambda x: tuple(x.shape), params)
        if shapes != found:
            raise ConfigError(
                f"config.distill_student_layers: the teacher's layers make a "
                f"{encoders.family_of(student.config).describe(student.config)} model, not the "
                f"{encoders.family_of(model_config).describe(model_config)} of config.model"
            )
        shardings = jax.tree.map(lambda x: x.sharding, abstract_params)
        return jax.device_put(params, shardings)

    def flops(self, family, model_config, seq_len: int, predictions: int, options=None) -> float:
        """The student's training and the teacher's forward pass (a third of training's)."""
        student = super().flops(family, model_config, seq_len, predictions, options)
        if options is None or not options.teacher:
            return student
        teacher = _open(options.teacher).config
        forward = perf.training_flops_per_sequence(
            teacher,
            seq_len,
            predictions,
            feed_forward_matrices=encoders.family_of(teacher).feed_forward_matrices,
            sentence_pair_head=False,
        )
        return student + forward / 3.0


def _open(path: str) -> rundir.Run:
    """The teacher run, as a pretrained model of its family."""
    try:
        return rundir.open_run(path)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"config.teacher={path!r}: {err}") from None


def _weights(value: Any) -> tuple[float, float, float] | None:
    """ "5,2,1" (or three numbers) as (ce, mlm, cos), or None if it is not that."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        weights = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        return None
    if len(weights) != 3 or min(weights) < 0 or max(weights) == 0:
        return None
    return weights


OBJECTIVE = Distillation()
