"""DTensor sharding rules for the ``torch.ops.fused_layernorm`` ops.

A norm is computed row by row, so an input sharded on a dim before the
normalized dims (sequence parallelism's ``Shard(1)``, a batch ``Shard(0)``) can
be normalized where it lies: each rank runs the op on its local rows, with the
weight and bias replicated.  The outputs keep the input's placement (mean and
rstd too), and the weight and bias gradients are each rank's sum over its own
rows, ``Partial("sum")``, which DTensor reduces when the gradient is used.
Nothing is gathered.  An input sharded on a normalized dim, or a sharded weight,
is redistributed by DTensor onto one of these placements first.

DTensor is a tensor subclass and dispatches below autograd, so it sees the ops
that the C++ autograd calls: the ``*_fwd`` ops in the forward, the ``*_bwd`` ops
in the backward, and ``layer_norm``/``rms_norm``/``add_norm`` themselves where
no graph is recorded (``torch.no_grad``, inference mode).  Each gets a rule.

Dropout (``add_norm`` with ``dropout_p > 0``): on replicated inputs every rank
draws the same mask, as DTensor requires of replicated values, provided the
ranks' generators are seeded alike (``torch.manual_seed`` with one seed, as for
any DTensor random op).  On a sharded input every rank would draw the *same*
mask for its own rows (the mask depends on the seed and the local element
index), so the shards' masks would repeat one another; that is refused with a
``NotImplementedError`` rather than computed.

Registration needs ``torch.distributed.tensor``, whose import costs about half
a second, so ``import fused_layernorm`` does not import it: the rules are
registered at ``import fused_layernorm`` if ``torch.distributed.tensor`` is
already loaded, else on the first call of the functional API or the modules
with a tensor subclass once it is.  Code that calls ``torch.ops.fused_layernorm``
directly on DTensors, before any such call, calls :func:`register_sharding_rules`.
"""
import sys

__all__ = ["register_sharding_rules"]

_registered = False


def register_sharding_rules() -> None:
    """Registers the rules with DTensor (idempotent).  Raises ImportError where
    torch.distributed is not available."""
    global _registered
    if _registered:
        return
    from . import _sharding_rules

    _sharding_rules.register()
    _registered = True


def maybe_register() -> None:
    """Registers the rules if ``torch.distributed.tensor`` has been imported (no
    DTensor can exist before), without importing it."""
    if not _registered and "torch.distributed.tensor" in sys.modules:
        register_sharding_rules()
