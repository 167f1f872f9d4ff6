"""The sharding rules themselves (see ``distributed.py``).  Importing this module
imports ``torch.distributed.tensor``.

Each rule lists, for one mesh dim, the placements the op accepts: everything
replicated, or the input (and what follows its rows: residual, h, grad_out,
mean, rstd, the mask) ``Shard(d)`` on a dim ``d`` before the normalized dims,
with weight and bias replicated and their gradients ``Partial("sum")``.
DTensor expands that over every mesh dim and picks the cheapest, so an input
that already has one of these placements runs with no communication.
Outputs that are empty placeholders (h not stored, RMSNorm's mean, the mask
not asked for) and the two-element dropout seed are replicated; outputs the op
does not return are None.
"""
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
from torch.distributed.tensor.experimental import register_sharding

_ops = torch.ops.fused_layernorm
_R = Replicate()


def _placements(x, normalized_shape):
    """(placement of the input and its row-wise outputs, placement of a weight
    gradient) for each strategy: all replicated, or sharded on a leading dim."""
    yield _R, _R
    for d in range(x.ndim - len(normalized_shape)):
        yield Shard(d), Partial("sum")


def _opt(t, placement):
    return None if t is None else placement


def _check_dropout(op, x, dropout_p):
    if dropout_p > 0 and any(p.is_shard() for p in x.placements):
        raise NotImplementedError(
            f"fused_layernorm.{op}: dropout_p > 0 on a sharded DTensor input (placements {tuple(x.placements)}) "
            "is not supported: every shard would draw the same dropout mask for its local rows. Use dropout_p=0, "
            "or a replicated input.")


def layer_norm_fwd(x, shape, w, b, eps):
    return [([p, p, p], [p, None, _opt(w, _R), _opt(b, _R), None]) for p, _ in _placements(x, shape)]


def layer_norm(x, shape, w=None, b=None, eps=1e-5):
    return [([p], [p, None, _opt(w, _R), _opt(b, _R), None]) for p, _ in _placements(x, shape)]


def layer_norm_bwd(dy, x, shape, mean, rstd, w, b, mask):
    return [([p if mask[0] else None, red if mask[1] and w is not None else None,
              red if mask[2] and b is not None else None],
             [p, p, None, p, p, _opt(w, _R), _opt(b, _R), None]) for p, red in _placements(x, shape)]


def rms_norm_fwd(x, shape, w, eps):
    return [([p, p], [p, None, _opt(w, _R), None]) for p, _ in _placements(x, shape)]


def rms_norm(x, shape, w=None, eps=None):
    return [([p], [p, None, _opt(w, _R), None]) for p, _ in _placements(x, shape)]


def rms_norm_bwd(dy, x, shape, rstd, w, mask):
    return [([p if mask[0] else None, red if mask[1] and w is not None else None],
             [p, p, None, p, _opt(w, _R), None]) for p, red in _placements(x, shape)]


def add_norm_fwd(x, residual, shape, w, b, eps, rms, dropout_p, weight_offset, residual_dtype, store_h, store_mask,
                 generator):
    _check_dropout("add_norm_fwd", x, dropout_p)
    # Outputs: y, h, mean, rstd, rng_state, mask.
    return [([p, p if store_h else _R, _R if rms else p, p, _R, p if store_mask else _R],
             [p, _opt(residual, p), None, _opt(w, _R), _opt(b, _R)] + [None] * 8)
            for p, _ in _placements(x, shape)]


def add_norm(x, residual, shape, w=None, b=None, eps=None, rms=False, dropout_p=0.0, weight_offset=0.0,
             residual_dtype=None, return_residual=False, return_mask=False, generator=None):
    _check_dropout("add_norm", x, dropout_p)
    # Outputs: y, h, mask.
    return [([p, p if return_residual else _R, p if return_mask else _R],
             [p, _opt(residual, p), None, _opt(w, _R), _opt(b, _R)] + [None] * 8)
            for p, _ in _placements(x, shape)]


def add_norm_bwd(dy, dh, h, shape, mean, rstd, w, b, rms, dropout_p, weight_offset, rng_state, input_dtype, mask):
    # As the kernel: with no dropout and h of the input's dtype, dx is also the
    # residual's gradient and is returned once (as dx).
    shared = dropout_p == 0 and h.tensor_meta.dtype == input_dtype
    return [([p if mask[0] or (shared and mask[1]) else None, p if mask[1] and not shared else None,
              red if mask[2] and w is not None else None, red if mask[3] and b is not None else None],
             [p, _opt(dh, p), p, None, _opt(mean, _R if rms else p), p, _opt(w, _R), _opt(b, _R), None, None, None,
              _opt(rng_state, _R), None, None])
            for p, red in _placements(h, shape)]


# op -> (rule, index of normalized_shape).  The arguments from normalized_shape
# on decide the placements (the shape, which outputs exist, dropout), so they
# are part of DTensor's cache key.  register_sharding's own default would leave
# them out: it keys on the arguments from the first `int`, and these ops have none.
_RULES = {
    "layer_norm_fwd": (layer_norm_fwd, 1),
    "layer_norm_bwd": (layer_norm_bwd, 2),
    "rms_norm_fwd": (rms_norm_fwd, 1),
    "rms_norm_bwd": (rms_norm_bwd, 2),
    "layer_norm": (layer_norm, 1),
    "rms_norm": (rms_norm, 1),
    "add_norm_fwd": (add_norm_fwd, 2),
    "add_norm_bwd": (add_norm_bwd, 3),
    "add_norm": (add_norm, 2),
}


def register() -> None:
    propagator = DTensor._op_dispatcher.sharding_propagator
    for name, (rule, static_argnum) in _RULES.items():
        op = getattr(_ops, name).default
        register_sharding(op)(rule)
        propagator.op_to_schema_info[op] = RuntimeSchemaInfo(static_argnum, needs_pytree=True)
