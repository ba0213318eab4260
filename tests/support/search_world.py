"""A tiny study where the right layer profile is known: for `surgery search` and the halves.

A tiny Llama M is trained for a few seconds on two languages of the demo's synthetic world (one
held in, one in `others:`). BASE is M with seeded noise on its first layer (it never "learned"
that layer); TRAINED is M with noise on its last layer (a block damaged in training). So the
profile that keeps TRAINED's first layer and reverts its last is M itself,
better than either checkpoint on both languages; the middle layers are the same in all three.
With blocks 0:2 and 2:4 that profile is `0:2=1,2:4=0`; none of the seeded baselines (TRAINED,
the middle layers 1:3 reverted, uniform strengths) reverts the last layer alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from demo.world import build_languages, sentences
from tests.support.tiny_models import make_tokenizer, save, vocab_size

LAYERS = 4
IDEAL = "0:2=1,2:4=0"  # the profile that is M (blocks 0:2 and 2:4)
HELD_IN, OTHER = "ces_Latn", "eng_Latn"  # the demo's sla1 and gen under FLORES codes
DOCS = 16  # perplexity documents per language (8 per half)
SUITE = """\
families:
  slavic: {held_in: [ces_Latn]}
others: [eng_Latn]
tasks:
  ppl: {path: "ppl/{lang}/"}
root: .
"""


def _texts(count: int, seed: int) -> dict[str, list[str]]:
    """`count` sentences in the held-in language (sla1) and in the base's (gen)."""
    languages = {lang.code: lang for lang in build_languages(0)}
    concepts = sentences(count, seed)
    return {
        HELD_IN: [languages["sla1"].render(c) for c in concepts],
        OTHER: [languages["gen"].render(c) for c in concepts],
    }


def tiny_llama(layers: int, seed: int = 0) -> LlamaForCausalLM:
    """An untrained tiny Llama (hidden 32, untied head) over the tiny tokenizer's vocabulary."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


def _train(steps: int = 100) -> LlamaForCausalLM:
    """M: a tiny Llama trained on both languages (float32; about a second per 50 steps)."""
    model = tiny_llama(LAYERS)
    tokenizer = make_tokenizer()
    text = " ".join(s for lines in _texts(400, 1).values() for s in lines)
    ids = torch.tensor(tokenizer(text)["input_ids"])
    windows = ids[: len(ids) // 48 * 48].view(-1, 48)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (16,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.to(torch.bfloat16)


@torch.no_grad()
def _damaged(model: LlamaForCausalLM, layer: int, seed: int, scale: float) -> LlamaForCausalLM:
    """A copy of `model` with seeded noise on every weight of one layer."""
    copy = LlamaForCausalLM(model.config).to(torch.bfloat16)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    for name, param in copy.named_parameters():
        if name.startswith(f"model.layers.{layer}."):
            noise = torch.randn(param.shape, generator=generator) * scale
            param.add_(noise.to(param.dtype))
    return copy


def build(root: Path, docs: int = DOCS) -> dict[str, Path]:
    """M, BASE, TRAINED and the suite (perplexity held in and on `others`, `docs` documents per
    language) under `root`."""
    model = _train()
    paths = {
        "m": save(model, root / "m"),
        "base": save(_damaged(model, 0, seed=1, scale=0.3), root / "base"),
        "trained": save(_damaged(model, LAYERS - 1, seed=2, scale=0.3), root / "trained"),
    }
    for lang, lines in _texts(docs * 2, 7).items():
        folder = root / "data" / "ppl" / lang
        folder.mkdir(parents=True)
        docs = [" ".join(lines[i : i + 2]) for i in range(0, len(lines), 2)]
        (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    paths["suite"] = root / "data" / "suite.yml"
    paths["suite"].write_text(SUITE, encoding="utf-8")
    return paths
