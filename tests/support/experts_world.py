"""A tiny study of several experts where the right per-block soup is known: for `surgery search`
with three experts.

BASE is a tiny Llama trained for a few seconds on the demo world's general language (gen, the
suite's `others:`). Each expert is BASE with one known layer trained on its own family's
language, gen replayed beside it (expert k: layer k, k = 0, 1, 2), then seeded noise on the
last layer (a block damaged in training). So the soup that takes layer k from expert k and
BASE's last layer learns each family and keeps BASE's last layer; none of the baselines (the
uniform Expert Soup, each expert alone, the soup of reverted experts, uniform strengths, BASE)
takes BASE's last layer alone. With blocks 0:1, 1:2, 2:3, 3:4 that profile is `IDEAL`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from demo.world import build_languages, sentences
from tests.support.search_world import tiny_llama
from tests.support.tiny_models import make_tokenizer, save

LAYERS = 4
BLOCKS = "0:1,1:2,2:3,3:4"
# The family of each expert, its language (the demo's first language of the family, named as
# a suite names it) and the layer it learns.
FAMILIES = {"slavic": "sla1", "germanic": "ger1", "indic": "ind1"}
OTHER = "gen"
IDEAL = "0:1=1[1 0 0],1:2=1[0 1 0],2:3=1[0 0 1],3:4=0"
DOCS = 16  # perplexity documents per language (8 per half)
STEPS = 40  # each expert's training steps
NOISE = 1.0  # the scale of the noise on each expert's last layer


def _flores(code: str) -> str:
    return next(lang.flores for lang in build_languages(0) if lang.code == code)


def suite_text() -> str:
    """Three families of one held-in language each, and gen in `others:`."""
    families = "".join(
        f"  {family}: {{held_in: [{_flores(code)}]}}\n" for family, code in FAMILIES.items()
    )
    return (
        f"families:\n{families}others: [{_flores(OTHER)}]\n"
        'tasks:\n  ppl: {path: "ppl/{lang}/"}\nroot: .\n'
    )


def _texts(codes: list[str], count: int, seed: int) -> dict[str, list[str]]:
    languages = {lang.code: lang for lang in build_languages(0)}
    concepts = sentences(count, seed)
    return {code: [languages[code].render(c) for c in concepts] for code in codes}


def _windows(lines: list[str]) -> torch.Tensor:
    """Windows of 48 tokens of `lines` joined."""
    ids = torch.tensor(make_tokenizer()(" ".join(lines))["input_ids"])
    return ids[: len(ids) // 48 * 48].view(-1, 48)


def _fit(model: LlamaForCausalLM, windows: torch.Tensor, steps: int, seed: int) -> None:
    """`steps` AdamW steps on random batches of `windows` (the trainable parameters only)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (16,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _base() -> LlamaForCausalLM:
    model = tiny_llama(LAYERS)
    _fit(model, _windows(_texts([OTHER], 400, 1)[OTHER]), steps=100, seed=0)
    return model


def _expert(base: LlamaForCausalLM, code: str, layer: int, seed: int) -> LlamaForCausalLM:
    """BASE with `layer` trained on language `code`, then noise on the last layer."""
    model = LlamaForCausalLM(base.config)
    model.load_state_dict(base.state_dict())
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith(f"model.layers.{layer}.")
    texts = _texts([code, OTHER], 200, 2)  # its family's language, with gen replayed
    _fit(model, _windows([*texts[code], *texts[OTHER]]), steps=STEPS, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(f"model.layers.{LAYERS - 1}."):
                param.add_(torch.randn(param.shape, generator=generator) * NOISE)
    return model.to(torch.bfloat16)


def build(root: Path) -> dict[str, Path]:
    """BASE, the experts (`expert-<family>`) and the suite under `root`."""
    base = _base()
    paths = {}
    for layer, (family, code) in enumerate(FAMILIES.items()):
        expert = _expert(base, code, layer, seed=10 + layer)
        paths[family] = save(expert, root / f"expert-{family}")
    paths["base"] = save(base.to(torch.bfloat16), root / "base")
    return {**paths, "suite": write_suite(root)}


def write_suite(root: Path) -> Path:
    """The suite and its perplexity documents under `root / "data"`; returns the suite."""
    for code, lines in _texts([*FAMILIES.values(), OTHER], DOCS * 2, 7).items():
        folder = root / "data" / "ppl" / _flores(code)
        folder.mkdir(parents=True)
        docs = [" ".join(lines[i : i + 2]) for i in range(0, len(lines), 2)]
        (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    suite = root / "data" / "suite.yml"
    suite.write_text(suite_text(), encoding="utf-8")
    return suite
