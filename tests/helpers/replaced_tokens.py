"""What the replaced-token detection tests of every family share: the gradients of the two
losses, and the discriminator's marks on texts, in this process and in a fresh one (the
notebook's road)."""

import json

import jax

from tests.helpers.xla_env import script_json

# The notebook's road in a fresh process: the run opened alone and on a mesh of the 8 devices,
# the discriminator's marks and the generator's guesses.
NOTEBOOK = """
import json, sys
import bertjax
from bertjax.nn import sharding

texts = json.loads(sys.argv[2])
out = {}
for name, mesh in (("alone", None), ("mesh", sharding.make_mesh((4, 2, 1)))):
    m = bertjax.Model.load(sys.argv[1], mesh=mesh)
    filled = m.networks["generator"].fill_mask("the [MASK] sat on the mat", top_k=3)
    out[name] = {
        "model": repr(m),
        "generator": m.networks["generator"].config.hidden_size,
        "scores": [[t["score"] for t in text] for text in m.replaced(texts)],
        "filled": [[f["token"], f["score"]] for f in filled],
    }
print(json.dumps(out))
"""


def opened_in_a_fresh_process(workdir, texts: list[str], cwd) -> dict:
    """{"alone" | "mesh": {"model": repr, "generator": its hidden size, "scores": each text's
    marks, "filled": [token, score] of the generator's top 3}} of the run in `workdir` opened
    by NOTEBOOK."""
    return script_json(NOTEBOOK, workdir, json.dumps(texts), cwd=cwd)


def scores(model, texts: list[str]) -> list[list[float]]:
    """Each text's tokens' replaced-token probabilities from `model` (a bertjax.Model)."""
    return [[token["score"] for token in text] for text in model.replaced(texts)]


def loss_gradients(step, params, batch, rng) -> tuple:
    """(gradient of the discriminator's loss, gradient of the generator's loss) with respect to
    `params`, of an RtdLoss `step` on `batch`, deterministic, with the sample drawn by `rng`."""

    @jax.jit
    def grads(p):
        def part(name):
            return lambda q: getattr(step.sums(q, batch, rng=rng, deterministic=True), name)

        return jax.grad(part("discriminator_loss"))(p), jax.grad(part("generator_loss"))(p)

    return grads(params)
