"""Scaled dot-product attention on every backend: xla, cuDNN (NVIDIA GPU), splash (TPU).

All implementations take query/key/value as [batch, seq, heads, head_dim] in the compute
dtype and a key padding mask [batch, seq] (1 = real token, 0 = padding), and return
[batch, seq, heads, head_dim]. Scores are scaled by 1/sqrt(head_dim); padded keys get zero
weight; the softmax runs in float32. Rows of padded *queries* carry no meaning but are always
finite, so nothing NaN can leak into a loss through them.

Choosing an implementation (``resolve_implementation``):
  "auto"   TPU -> splash when the shapes allow; NVIDIA GPU with bf16/fp16 -> cudnn; CPU ->
           blocked (one device; documents or a window only without attention dropout);
           else xla.
  "xla"    jax.nn.dot_product_attention(implementation="xla"); with attention dropout active,
           an einsum path that drops attention weights explicitly.
  "blocked" CPU (bertjax.nn.cpu_attention): attention block by block of (example, head)
           pairs, each block's scores kept in cache and recomputed in the backward pass
           (flash attention's scheme, in XLA);
           with attention dropout too (the same mask as xla's). One device. Documents and
           windows (ModernBERT's layers) run a blocked path of their own, without dropout:
           the mask is made inside each block from the ids and positions, and a window's
           rows attend by chunks against their band of keys, so neither the [seq, seq]
           probabilities nor a [seq, seq] mask ever exist whole; a block whose real queries
           all lie in the first half of its rows computes that half only (padded queries
           past it get zeros).
  "cudnn"  the fused cuDNN flash-attention kernel. Padding is passed as key/value sequence
           lengths (the count of ones in the mask), so the mask must be a prefix of ones, as
           BERT's input_mask always is.
  "splash" the Pallas TPU splash-attention kernel, called inside jax.shard_map so batch and
           heads stay sharded; padding is expressed as segment ids. Off TPU it runs in Pallas
           interpret mode (correct but slow; meant for tests).
Packed rows of several documents pass ``document_ids`` [batch, seq] (1.. per document, 0 for
padding) instead of relying on the padding mask: a query then sees exactly the keys of its
own document (padded queries see padded keys, so rows stay finite). xla builds that mask;
splash takes the ids as its segment ids; blocked compares them inside each block; cuDNN
(padding as sequence lengths) cannot express it, so such a request runs the xla path, the
reason logged once.
A sliding window (``local_window`` w, ModernBERT's local layers: query i sees key j only when
|i - j| <= w) combines with the padding or document mask. xla builds the band mask; splash
gives each head a LocalMask((seq, seq), window_size=(w, w)) and skips the blocks outside the
band; blocked computes chunks of w queries against their 3w keys; cuDNN cannot serve it:
jax's cuDNN attention takes only a one-sided (causal) window and refuses a two-sided one, so
such a request runs the xla path, the reason logged once.
An explicit "cudnn" or "splash" request is served when the kernel can serve it; otherwise
the xla path runs and the reason is logged once (python logging, WARNING). The fused
kernels cannot drop attention weights, so while attention dropout is active (training with
attention_dropout > 0) every request runs the xla path (logged once at INFO).
"""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from bertjax.nn import cpu_attention, sharding
from bertjax.nn.masks import MASK_VALUE, dropout_keep_mask, logit_mask

logger = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "xla", "blocked", "cudnn", "splash")

# The name scope of attention's operations in a compiled program's op names (profiles find
# attention by it, whichever backend computes it).
SCOPE = "dot_product_attention"

_logged: set[str] = set()


def _log_once(level: int, message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.log(level, message)


def _platform() -> str:
    """'tpu', 'nvidia' (CUDA GPU), 'gpu' (other GPU) or 'cpu'."""
    backend = jax.default_backend()
    if backend == "gpu":
        version = jax.devices()[0].client.platform_version.lower()
        return "nvidia" if "cuda" in version else "gpu"
    return backend


def _splash_problem(seq_len: int, batch: int, num_heads: int) -> str | None:
    """Why splash cannot serve these shapes under the current mesh, or None."""
    if seq_len % 128:
        return f"sequence length {seq_len} is not a multiple of 128 (splash block size)"
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        batch_shards = sharding.shards(sharding.BATCH)
        head_shards = sharding.shards(sharding.HEADS)
        if batch % batch_shards or num_heads % head_shards:
            return (
                f"batch {batch} / heads {num_heads} do not divide the mesh's "
                f"{batch_shards} batch shards / {head_shards} head shards"
            )
    return None


def _cudnn_problem(
    dtype, head_dim: int, document_mask: bool = False, local_window: int | None = None
) -> str | None:
    """Why cuDNN flash attention cannot serve this dtype/shape/mask, or None."""
    if document_mask:
        return (
            "cuDNN flash attention takes padding as sequence lengths and cannot restrict "
            "attention to each token's document (packed rows)"
        )
    if local_window is not None:
        # jax.nn.dot_product_attention(implementation="cudnn") passes cuDNN one left window
        # length and raises "cuDNN doesn't support right window" for a two-sided window
        # without a causal mask (jax 0.10): an encoder's |i - j| <= w is not expressible.
        return (
            "jax's cuDNN flash attention takes only a one-sided (causal) sliding window, not "
            f"the two-sided window |i - j| <= {local_window}"
        )
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN flash attention needs bfloat16 or float16, got {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > 128:
        return f"cuDNN flash attention needs head_dim a multiple of 8 and <= 128, got {head_dim}"
    return None


def _blocked_problem(
    document_mask: bool, local_window: int | None = None, dropout_active: bool = False
) -> str | None:
    if dropout_active and (document_mask or local_window is not None):
        return "it drops attention weights with a padding mask only, not documents or windows"
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return f"it runs on one device, the mesh has {mesh.size}"
    return None


def resolve_implementation(
    requested: str,
    *,
    dtype,
    batch: int,
    seq_len: int,
    num_heads: int,
    head_dim: int,
    dropout_active: bool = False,
    document_mask: bool = False,
    local_window: int | None = None,
) -> str:
    """The implementation that will actually run ("xla", "blocked", "cudnn" or "splash").

    ``document_mask``: attention is restricted to each token's document (document_ids).
    ``local_window``: attention is restricted to a sliding window (|i - j| <= local_window).
    """
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {requested!r} is not one of {IMPLEMENTATIONS}")
    platform = _platform()
    if requested in ("auto", "blocked") and platform == "cpu":
        problem = _blocked_problem(document_mask, local_window, dropout_active)
        if problem is None:
            return "blocked"
        if requested == "blocked":
            _log_once(logging.INFO, f"attention 'blocked' falls back to xla: {problem}")
        return "xla"
    if dropout_active:
        if requested != "xla":
            _log_once(
                logging.INFO,
                f"attention {requested!r}: attention dropout is active and the fused kernels "
                "cannot apply it; using the xla path with explicit dropout on the weights",
            )
        return "xla"
    if requested == "auto":
        if platform == "tpu":
            problem = _splash_problem(seq_len, batch, num_heads)
            if problem is None:
                return "splash"
            _log_once(logging.INFO, f"attention 'auto' uses xla, not splash: {problem}")
        elif platform == "nvidia":
            problem = _cudnn_problem(dtype, head_dim, document_mask, local_window)
            if problem is None:
                return "cudnn"
            _log_once(logging.INFO, f"attention 'auto' uses xla, not cudnn: {problem}")
        return "xla"
    if requested == "cudnn":
        problem = (
            f"cuDNN needs an NVIDIA GPU, the backend is {platform!r}"
            if platform != "nvidia"
            else _cudnn_problem(dtype, head_dim, document_mask, local_window)
        )
        if problem:
            _log_once(logging.WARNING, f"attention 'cudnn' falls back to xla: {problem}")
            return "xla"
        return "cudnn"
    if requested == "splash":
        problem = _splash_problem(seq_len, batch, num_heads)
        if problem:
            _log_once(logging.WARNING, f"attention 'splash' falls back to xla: {problem}")
            return "xla"
        if platform != "tpu":
            _log_once(
                logging.WARNING,
                f"attention 'splash' on {platform!r} runs in Pallas interpret mode (slow)",
            )
        return "splash"
    return "xla"


def _xla_dropout_attention(
    query,
    key,
    value,
    attention_mask,
    dropout_rate,
    dropout_rng,
    document_ids,
    query_document_ids,
    local_window=None,
):
    """Einsum attention that drops attention weights (what the fused kernels cannot do)."""
    scale = 1.0 / math.sqrt(query.shape[-1])
    logits = (
        jnp.einsum("bsnd,btnd->bnst", query, key, preferred_element_type=jnp.float32) * scale
    )  # [batch, heads, q_seq, kv_seq]
    keep = logit_mask(
        attention_mask, document_ids, query_document_ids, local_window, query.shape[1]
    )
    if keep is not None:
        logits = jnp.where(keep, logits, MASK_VALUE)
    weights = jax.nn.softmax(logits, axis=-1)
    keep_prob = 1.0 - dropout_rate
    kept = dropout_keep_mask(dropout_rng, keep_prob, weights.shape)
    weights = jnp.where(kept, weights / keep_prob, 0.0).astype(value.dtype)
    return jnp.einsum("bnst,btnd->bsnd", weights, value)  # [batch, q_seq, heads, head_dim]


def _xla_attention(
    query,
    key,
    value,
    attention_mask,
    document_ids=None,
    query_document_ids=None,
    local_window=None,
):
    mask = logit_mask(
        attention_mask, document_ids, query_document_ids, local_window, query.shape[1]
    )
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")


def _cudnn_attention(query, key, value, attention_mask):
    lengths = None
    if attention_mask is not None:
        # At least one key per row: a fully padded example still gets finite outputs.
        lengths = jnp.maximum(jnp.sum(attention_mask.astype(jnp.int32), axis=-1), 1)  # [batch]
    return jax.nn.dot_product_attention(
        query, key, value, key_value_seq_lengths=lengths, implementation="cudnn"
    )


def _qkv_spec() -> PartitionSpec:
    return sharding.logical_to_spec((sharding.BATCH, sharding.LENGTH, sharding.HEADS, sharding.KV))


def _block_size(seq_len: int) -> int:
    for block in (512, 256, 128):
        if seq_len % block == 0:
            return block
    raise ValueError(f"splash attention needs a sequence length multiple of 128, got {seq_len}")


def _splash_local(query, key, value, segment_ids, *, interpret: bool, local_window=None):
    """Splash attention on one device's shard: [b, s, n, d] with segment ids [b, s]; with a
    local window, each head's mask is the band |i - j| <= local_window (the kernel skips the
    blocks outside it)."""
    _, seq_len, num_heads, head_dim = query.shape
    block = _block_size(seq_len)
    blocks = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    if local_window is None:
        head_mask = splash.FullMask((seq_len, seq_len))
    else:
        head_mask = splash.LocalMask(
            (seq_len, seq_len), window_size=(local_window, local_window), offset=0
        )
    mask = splash.MultiHeadMask([head_mask] * num_heads)
    kernel = splash.make_splash_mha(
        mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret
    )
    # The kernel does not scale scores; scale the queries instead.
    query = query * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype)
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))  # [b, heads, seq, head_dim]

    def one(q1, k1, v1, seg1):
        return kernel(q1, k1, v1, segment_ids=splash.SegmentIds(q=seg1, kv=seg1))

    out = jax.vmap(one)(q, k, v, segment_ids)  # [b, heads, seq, head_dim]
    return jnp.swapaxes(out, 1, 2)  # [b, seq, heads, head_dim]


def _splash_attention(query, key, value, attention_mask, document_ids=None, local_window=None):
    batch, seq_len = query.shape[:2]
    if document_ids is not None:
        # Each document is a segment; padding (0) is one more, as below.
        segment_ids = document_ids.astype(jnp.int32)  # [batch, seq]
    elif attention_mask is None:
        segment_ids = jnp.ones((batch, seq_len), jnp.int32)
    else:
        # Real tokens are segment 1, padding segment 0: real queries see only real keys, and
        # padded queries see only padded keys, so no row is empty (no NaN).
        segment_ids = attention_mask.astype(jnp.int32)  # [batch, seq]
    local = functools.partial(
        _splash_local, interpret=_platform() != "tpu", local_window=local_window
    )
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return local(query, key, value, segment_ids)
    qkv = _qkv_spec()
    seg = PartitionSpec(qkv[0], qkv[1])
    mapped = jax.shard_map(
        local, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv, check_vma=False
    )
    return mapped(query, key, value, segment_ids)


@functools.partial(jax.named_call, name=SCOPE)
def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    attention_mask: jax.Array | None = None,
    *,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    document_ids: jax.Array | None = None,
    query_document_ids: jax.Array | None = None,
    local_window: int | None = None,
) -> jax.Array:
    """Multi-head attention [batch, seq, heads, head_dim] with a key padding mask [batch, seq].

    ``dropout_rng`` is required when dropout is active (deterministic=False, rate > 0).
    ``document_ids`` [batch, kv_seq] (0 for padding) restrict each query to its own
    document's keys, in place of the padding mask; ``query_document_ids`` [batch, q_seq] are
    the queries' when there are fewer queries than keys (the xla path only).
    ``local_window`` (the half-width, as many queries as keys): query i sees key j only when
    |i - j| <= local_window, besides the padding or document mask.
    """
    dropout_active = (not deterministic) and dropout_rate > 0.0
    batch, seq_len, num_heads, head_dim = query.shape
    if local_window is not None:
        if not isinstance(local_window, (int, np.integer)) or local_window < 0:
            raise ValueError(
                f"local_window={local_window!r} is invalid: must be a non-negative int (the "
                "window's half-width) or None"
            )
        if key.shape[1] != seq_len:
            raise ValueError(
                f"local_window needs as many queries as keys, got {seq_len} queries and "
                f"{key.shape[1]} keys"
            )
        local_window = int(local_window)
    impl = resolve_implementation(
        implementation,
        dtype=query.dtype,
        batch=batch,
        seq_len=seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        dropout_active=dropout_active,
        document_mask=document_ids is not None,
        local_window=local_window,
    )
    if query_document_ids is not None and impl == "blocked":
        impl = "xla"  # the blocked path's documents have as many queries as keys
    if query_document_ids is not None and impl != "xla":
        raise ValueError("query_document_ids (fewer queries than keys) needs the xla path")
    if impl == "blocked" and (document_ids is not None or local_window is not None):
        if document_ids is None:
            document_ids = (
                jnp.ones((batch, seq_len), jnp.int32)
                if attention_mask is None
                else attention_mask.astype(jnp.int32)  # real tokens 1, padding 0
            )
        return cpu_attention.masked_blocked_attention(query, key, value, document_ids, local_window)
    if impl == "blocked":
        if dropout_active and dropout_rng is None:
            raise ValueError("attention dropout is active but no dropout_rng was given")
        keep_prob = 1.0 - dropout_rate if dropout_active else 1.0
        return cpu_attention.blocked_attention(
            query, key, value, attention_mask, keep_prob, dropout_rng
        )
    if dropout_active:
        if dropout_rng is None:
            raise ValueError("attention dropout is active but no dropout_rng was given")
        return _xla_dropout_attention(
            query,
            key,
            value,
            attention_mask,
            dropout_rate,
            dropout_rng,
            document_ids,
            query_document_ids,
            local_window,
        )
    if impl == "cudnn":  # never with a window: see _cudnn_problem
        return _cudnn_attention(query, key, value, attention_mask)
    if impl == "splash":
        return _splash_attention(query, key, value, attention_mask, document_ids, local_window)
    return _xla_attention(
        query, key, value, attention_mask, document_ids, query_document_ids, local_window
    )
