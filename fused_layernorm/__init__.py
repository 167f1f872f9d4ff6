"""fused_layernorm: fused LayerNorm and RMSNorm kernels for PyTorch, and the rotary
position embedding (Hugging Face's apply_rotary_pos_emb) and softmax / log-softmax
(with the attention form's scale and causal mask) in one kernel each.

The ops are defined once in C++ (``torch.ops.fused_layernorm.*``) with CPU and
CUDA backends, meta kernels for ``torch.compile`` and autograd in C++.  This
package is the thin Python front end.
"""
import torch  # noqa: F401  (loads libtorch, which the extension links against)

from . import _C  # noqa: F401  (loads the extension and registers the ops)
from . import distributed
from .functional import (apply_rotary_pos_emb, fused_layer_norm, fused_rms_norm, layer_norm, log_softmax, rms_norm,
                         softmax)
from .modules import FusedLayerNorm, FusedRMSNorm, FusedRotaryEmbedding
# fused_layernorm.patch names the function; "from fused_layernorm.patch import ..." still reaches the file.
from .patch import PatchReport, patch, to_fused

__all__ = [
    "fused_layer_norm",
    "layer_norm",
    "fused_rms_norm",
    "rms_norm",
    "FusedLayerNorm",
    "FusedRMSNorm",
    "apply_rotary_pos_emb",
    "FusedRotaryEmbedding",
    "softmax",
    "log_softmax",
    "patch",
    "to_fused",
    "PatchReport",
]
__version__ = "0.1.0"

# DTensor sharding rules, now if torch.distributed.tensor is loaded (else on first use).
distributed.maybe_register()
