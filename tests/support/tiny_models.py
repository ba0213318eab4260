"""Tiny random models of real architectures, saved as real sharded Hugging Face checkpoints.

Built from transformers configs (no download). A "trained" model or an "expert" is the base with
seeded noise added to every float parameter, so surgery results are easy to predict.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from demo.pipeline import train_tokenizer

VOCAB = 128
NUM_LAYERS = 4
ARCHS = ("llama", "gemma3", "gemma3mm", "gpt2", "bert")
# Multimodal architectures whose text model has a text-only class (`text_only`).
MULTIMODAL = ("gemma3mm", "mistral3")
# Shard size small enough that every tiny model is saved as several shards.
SHARD_SIZE = "40KB"

_CORPUS = [
    "the cat sat on the mat. a dog ran in the park.",
    "numbers: 1 2 3 4 5 6 7 8 9 0 and letters a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "Belebele asks a question about a passage; answer A, B, C or D.",
    "English sentence: hello world. Target sentence: halo dunia.",
]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer trained on a fixed corpus: deterministic, offline."""
    return train_tokenizer(_CORPUS, vocab=VOCAB)


def vocab_size() -> int:
    """Embedding rows the tiny models need to cover the tokenizer (byte alphabet + specials)."""
    return len(make_tokenizer())


def build_model(arch: str, seed: int = 0) -> PreTrainedModel:
    """A tiny random model of `arch` (one of ARCHS, or `gpt_neox`), deterministic from `seed`."""
    torch.manual_seed(seed)
    vocab = vocab_size()
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=2,
        max_position_embeddings=128,
    )
    if arch == "llama":
        config = LlamaConfig(
            **common,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        return LlamaForCausalLM(config).to(torch.bfloat16)
    if arch in ("gemma3", "gemma3mm"):
        text = dict(
            **common,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=16,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        if arch == "gemma3":
            return Gemma3ForCausalLM(Gemma3TextConfig(**text)).to(torch.bfloat16)
        vision = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        config = Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=4,
            image_token_index=vocab - 1,
            boi_token_index=vocab - 2,
            eoi_token_index=vocab - 3,
        )
        return Gemma3ForConditionalGeneration(config).to(torch.bfloat16)
    if arch == "mistral3":
        text = dict(
            **common, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, pad_token_id=0
        )
        vision = dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            head_dim=16,
            image_size=28,
            patch_size=14,
        )
        # Untied like the published Mistral-Small-3.1 (its head is `language_model.lm_head`).
        config = Mistral3Config(
            text_config=text,
            vision_config=vision,
            image_token_index=vocab - 1,
            spatial_merge_size=1,
            tie_word_embeddings=False,
        )
        return Mistral3ForConditionalGeneration(config).to(torch.bfloat16)
    if arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=NUM_LAYERS,
            n_head=2,
            n_positions=128,
            bos_token_id=1,
            eos_token_id=2,
        )
        return GPT2LMHeadModel(config)
    if arch == "gpt_neox":
        # Its head is `embed_out.weight`, outside `gpt_neox.`: a name that says "embed" but is a
        # "post" weight.
        config = GPTNeoXConfig(**common, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        return GPTNeoXForCausalLM(config)
    if arch == "bert":
        config = BertConfig(**common, type_vocab_size=2, pad_token_id=0)
        return BertForMaskedLM(config)
    raise ValueError(f"unknown arch {arch!r}")


@torch.no_grad()
def perturb(model: PreTrainedModel, seed: int, scale: float = 0.05) -> PreTrainedModel:
    """Add seeded noise to every float parameter, in place (a stand-in for training)."""
    gen = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        if param.is_floating_point():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * scale
            param.add_(noise.to(param.dtype))
    return model


def save(model: PreTrainedModel, path: Path, shard_size: str = SHARD_SIZE) -> Path:
    """Save as a sharded safetensors checkpoint with a tokenizer, like a Hub model folder."""
    model.save_pretrained(path, max_shard_size=shard_size)
    make_tokenizer().save_pretrained(path)
    return path


def random_llama(
    folder: Path,
    *,
    hidden: int,
    layers: int,
    vocab: int = 0,
    heads: int = 4,
    kv_heads: int = 2,
    positions: int = 512,
    shard_size: str = SHARD_SIZE,
) -> Path:
    """A seeded random bf16 Llama of the given size, saved with the tiny tokenizer; `vocab`
    embedding rows at least (the tokenizer uses the first few)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=max(vocab, vocab_size()),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return save(LlamaForCausalLM(config).to(torch.bfloat16), folder, shard_size)


def build_family(arch: str, root: Path, experts: int = 3) -> dict[str, Path | list[Path]]:
    """Save base, trained and `experts` expert checkpoints of one architecture under root."""
    paths: dict[str, Path | list[Path]] = {"base": save(build_model(arch), root / "base")}
    paths["trained"] = save(perturb(build_model(arch), seed=100), root / "trained")
    paths["experts"] = [
        save(perturb(build_model(arch), seed=200 + i), root / f"expert{i}") for i in range(experts)
    ]
    return paths


def add_position_ids(path: Path) -> None:
    """Append an int64 `bert.embeddings.position_ids` tensor, as older BERT checkpoints have.

    transformers 5 no longer saves this buffer, but Hub checkpoints still carry it, and it is the
    classic non-float tensor that must never be averaged.
    """
    import json

    from safetensors.torch import load_file, save_file

    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    tensors = load_file(path / shard)
    tensors["bert.embeddings.position_ids"] = torch.arange(128, dtype=torch.int64)[None]
    save_file(tensors, path / shard, metadata={"format": "pt"})
    index["weight_map"]["bert.embeddings.position_ids"] = shard
    index_path.write_text(json.dumps(index, indent=2))


def add_gpt_neox_buffers(path: Path) -> None:
    """Append the attention buffers older GPT-NeoX checkpoints carry (`attention.bias`,
    `attention.masked_bias`, `attention.rotary_emb.inv_freq`, per layer).

    transformers 5 no longer saves them, but mergekit's GPT-NeoX architecture requires them.
    """
    import json

    from safetensors.torch import load_file, save_file

    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    tensors = load_file(path / shard)
    for layer in range(NUM_LAYERS):
        head = f"gpt_neox.layers.{layer}.attention"
        tensors[f"{head}.bias"] = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
        tensors[f"{head}.masked_bias"] = torch.tensor(-1e9)
        tensors[f"{head}.rotary_emb.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, 16, 2) / 16)
    save_file(tensors, path / shard, metadata={"format": "pt"})
    index["weight_map"] |= dict.fromkeys(tensors, shard)
    index_path.write_text(json.dumps(index, indent=2))


def text_only(model: PreTrainedModel) -> PreTrainedModel:
    """The text model of a multimodal Gemma-3 or Mistral-3 as its text-only class, made as the
    paper's reference code makes it (sanchit-ahuja/scaling-multilingual-experts, `utils.py`):
    the config's `text_config`, the state dict with `language_model.` dropped from every name,
    the vision tower and projector left out. The tensors are the same weights, text-only names."""
    text_class = {"gemma3": Gemma3ForCausalLM, "mistral3": MistralForCausalLM}
    text = text_class[model.config.model_type](model.config.text_config)
    state = {
        name.replace(".language_model.", ".", 1): tensor
        for name, tensor in model.state_dict().items()
        if "vision_tower" not in name and "multi_modal_projector" not in name
    }
    missing, unexpected = text.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return text.to(torch.bfloat16)


def rename_tensors(path: Path, rename) -> None:
    """Rewrite a saved checkpoint's tensor names with `rename(name) -> name` (shards and index):
    another naming of the same weights."""
    import json

    from safetensors.torch import load_file, save_file

    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {rename(n): t for n, t in load_file(path / shard).items()}
        save_file(tensors, path / shard, metadata={"format": "pt"})
    index["weight_map"] = {rename(n): shard for n, shard in index["weight_map"].items()}
    index_path.write_text(json.dumps(index, indent=2))


def nested_name(name: str) -> str:
    """A multimodal tensor's name as some transformers 4.x releases saved it
    (`model.language_model.*`, `model.vision_tower.*`, `lm_head.*`) from the published naming
    (`language_model.model.*`, `vision_tower.*`, `language_model.lm_head.*`)."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    if name.startswith("language_model.lm_head."):
        return name.removeprefix("language_model.")
    return "model." + name


def grown_llama(vocab: int, seed: int) -> PreTrainedModel:
    """The tiny Llama trained (seeded noise) with its embeddings and head grown to `vocab` rows,
    as language adaptation grows a vocabulary; the added rows get noise of their own."""
    model = perturb(build_model("llama"), seed=seed)
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for param in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            added = torch.randn(param[old:].shape, generator=gen) * 0.02
            param[old:] = added.to(param.dtype)
    return model
