"""The figures the replay's options offer and default to, in a module of
their own: the command line's parser reads them without numpy, torch or the
engine (``radixcache.cli.replay.command``).

    BLOCK_SIZE       tokens per Mooncake trace hash block (``--block-size``)
    MODEL_PRESETS    ``--model``: KV bytes per token of known models, fp16
"""

from __future__ import annotations

BLOCK_SIZE = 512  # tokens per Mooncake hash block


def kv_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """KV bytes per token of a grouped-query attention model: K and V per layer."""
    return layers * kv_heads * head_dim * 2 * dtype_bytes


# --model presets: KV bytes per token in fp16/bf16, from each model's config
# (layers, KV heads, head dim); an MLA model keeps one latent of
# (kv_lora_rank + rope dim) values per layer instead of K and V.
MODEL_PRESETS: dict[str, int] = {
    "llama-3-8b": kv_bytes(32, 8, 128),  # 131,072
    "llama-3-70b": kv_bytes(80, 8, 128),  # 327,680
    "mistral-7b": kv_bytes(32, 8, 128),  # 131,072
    "qwen2.5-7b": kv_bytes(28, 4, 128),  # 57,344
    "qwen2.5-72b": kv_bytes(80, 8, 128),  # 327,680
    "deepseek-v3": 61 * (512 + 64) * 2,  # MLA latent: 70,272
}
DEFAULT_MODEL = "llama-3-8b"
