"""Small random Hugging Face models built from configs (no download), for the
patch tests and the end-to-end benchmark.  Needs transformers."""
from typing import Dict, Tuple

import torch

# arch -> (config class, model class, the norm class patch replaces)
ARCHS: Dict[str, Tuple[str, str, str]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "LayerNorm"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaRMSNorm"),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralRMSNorm"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2RMSNorm"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3RMSNorm"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "GemmaRMSNorm"),
    "t5": ("T5Config", "T5ForConditionalGeneration", "T5LayerNorm"),
}


def available(arch: str) -> bool:
    """Whether the installed transformers (if any) has ``arch``'s classes."""
    try:
        import transformers
    except ImportError:
        return False
    return all(hasattr(transformers, name) for name in ARCHS[arch][:2])


def norm_count(arch: str, layers: int) -> int:
    """How many norm modules the model has: two a block and a final one; Qwen3 adds
    q_norm and k_norm a block; T5's decoder blocks have three, and encoder and decoder
    each end with one."""
    if arch == "qwen3":
        return 4 * layers + 1
    if arch == "t5":
        return (2 * layers + 1) + (3 * layers + 1)
    return 2 * layers + 1


def make_config(arch: str, *, hidden: int = 64, layers: int = 2, heads: int = 4, vocab: int = 128,
                positions: int = 1024, intermediate: int = 0):
    """A config with dropout off (so stock and patched runs see the same forward in
    train mode) and the given sizes."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    cfg_cls = getattr(transformers, ARCHS[arch][0])
    intermediate = intermediate or 4 * hidden
    head_dim = hidden // heads
    if arch == "gpt2":
        return cfg_cls(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=positions,
                       n_inner=intermediate, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if arch == "t5":
        return cfg_cls(vocab_size=vocab, d_model=hidden, d_kv=head_dim, d_ff=intermediate, num_layers=layers,
                       num_heads=heads, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=head_dim,
              max_position_embeddings=positions, attention_dropout=0.0, tie_word_embeddings=False)
    return cfg_cls(**kw)


def build(arch: str, *, dtype=torch.float32, device="cpu", seed: int = 0, **sizes):
    """A randomly initialized model of ``arch`` (see make_config for ``sizes``), with
    its norm weights (and biases) drawn at random too, so that they matter."""
    import transformers

    config = make_config(arch, **sizes)
    torch.manual_seed(seed)
    model = getattr(transformers, ARCHS[arch][1])(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, module in model.named_modules():
            if type(module).__name__ == ARCHS[arch][2]:
                for p in module.parameters(recurse=False):
                    p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model.to(device=device, dtype=dtype)


def batch(model, tokens: int, batch_size: int, gen: torch.Generator, device) -> dict:
    """Random token ids (and labels) for one training step of ``model``."""
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (batch_size, tokens), generator=gen).to(device)
    return dict(input_ids=ids, labels=ids)
