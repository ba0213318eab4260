"""Model cards (README.md) in the Hub's conventions, generated from a recipe.

Every surgery output gets one, so a local output documents itself; `surgery push` regenerates it
with the repository's name and any eval results found beside the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from surgery.engine.reader import CARD_NAME, RECIPE_NAME, RESULTS_NAME
from surgery.engine.recipe import public_copy, public_recipe


def _name(entry: dict) -> str:
    """An input as a card shows it: its Hub id, or its folder's name (never a local path)."""
    return entry.get("repo_id") or Path(entry["path"]).name


def _inputs_by_role(recipe: dict) -> dict[str, str]:
    return {entry["role"]: f"**{_name(entry)}**" for entry in recipe.get("inputs", [])}


def describe_operation(recipe: dict) -> str:
    """One paragraph saying what the operation did, in words."""
    operation, roles = recipe.get("operation"), _inputs_by_role(recipe)
    if operation == "revert":
        return _revert_sentence(recipe, roles)
    if operation == "soup":
        names = [f"**{_name(e)}**" for e in recipe.get("inputs", [])]
        weights = recipe.get("weights") or [1.0] * len(names)
        parts = ", ".join(f"{n} (weight {w:g})" for n, w in zip(names, weights, strict=False))
        return (
            f"A weighted average (model soup) of {len(names)} checkpoints: {parts}, normalized by "
            "the sum of the weights, accumulated in float32 and rounded once."
        )
    if operation == "interpolate":
        return _interpolate_sentence(recipe, roles)
    if operation == "merge":
        inputs = recipe.get("inputs", [])
        names = ", ".join(f"**{_name(e)}**" for e in inputs if e["role"] != "base")
        onto = f" onto the base {roles['base']}" if "base" in roles else ""
        seed = f" Random masks seeded with {recipe['seed']}." if "seed" in recipe else ""
        arithmetic = (
            " Computed with `--mergekit-arithmetic`: mergekit's own operations in the config's "
            "dtype, bit for bit."
            if recipe.get("mergekit_arithmetic")
            else ""
        )
        return (
            f"A mergekit `{recipe.get('method')}` merge of {names}{onto}, run by `surgery "
            "merge` on the streaming engine; the config is in the recipe below and in "
            f"mergekit_config.yml.{seed}{arithmetic}"
        )
    if operation == "extract-lora":
        where = f" of layers `{recipe['layers']}`" if recipe.get("layers") else ""
        return (
            f"A LoRA adapter (PEFT) for {roles.get('base')}: the change {roles.get('trained')} "
            f"- {roles.get('base')}{where}, factored per weight by SVD at rank "
            f"{recipe.get('max_rank_kept', '?')} at most (`--rank {recipe.get('rank')}`). "
            f"Loaded onto {roles.get('base')} it gives {roles.get('trained')}'s weights up to "
            "the discarded singular values."
        )
    if operation == "train":
        return (
            f"Continued pretraining of {roles.get('base')}: {recipe.get('steps', '?')} optimizer "
            f"steps on {recipe.get('tokens', '?')} tokens, saved in the base's exact layout "
            "(tensor names, shapes, dtypes and shard files)." + _l2sp_sentence(recipe)
        )
    return f"Made by the `{operation}` operation."


def _not_trained_base(recipe: dict, trained: str | None) -> str:
    """ ", not TRAINED's base X" for a graft whose recipe records the base TRAINED names (a Hub
    id, or a local path's last component: `public_copy`, as the recipe is published)."""
    named = recipe.get("trained_base")
    return f", not {trained}'s base **{public_copy(named)}**" if named else ""


def _revert_sentence(recipe: dict, roles: dict[str, str]) -> str:
    """A revert in words: a graft when BASE is a donor (TRAINED names another base), a revert
    to the base when TRAINED names BASE as its base, and neither claim when it names none."""
    where = (
        f"layers `{recipe['layers']}` of the {recipe.get('stack', 'text')} stack "
        f"({recipe.get('num_layers', '?')} layers)"
    )
    trained = roles.get("trained")
    if "donor" in roles:
        return (
            f"A graft: {where} come from the donor {roles['donor']}"
            f"{_not_trained_base(recipe, trained)}; every other tensor comes from {trained}. "
            "Grafted tensors are byte copies."
        )
    if recipe.get("trained_base"):
        return (
            f"{where[0].upper()}{where[1:]} are reverted to {roles.get('base')}, {trained}'s "
            f"base; every other tensor comes from {trained}. Reverted tensors are byte copies."
        )
    return (
        f"{where[0].upper()}{where[1:]} come from {roles.get('base')}; every other tensor "
        f"comes from {trained}. Reverted tensors are byte copies."
    )


def _interpolate_sentence(recipe: dict, roles: dict[str, str]) -> str:
    """An interpolation in words; with a beta (BASE's share), in the paper's graft form."""
    where = f" on layers `{recipe['layers']}`" if recipe.get("layers") else ""
    trained = roles.get("trained")
    donor = "donor" in roles
    source = roles.get("donor") if donor else roles.get("base")
    if recipe.get("beta") is not None:
        text = (
            f"{trained} + beta * ({source} - {trained}) with beta `{recipe['beta']}`{where} "
            f"(the {'donor' if donor else 'base'}'s share; alpha = 1 - beta)"
        )
    else:
        text = (
            f"(1 - alpha) * {source} + alpha * {trained} with alpha `{recipe.get('alpha')}`{where}"
        )
    text += f"; tensors not covered come from {trained}."
    if donor:
        text += f" A graft: {source} is a donor{_not_trained_base(recipe, trained)}."
    if recipe.get("extrapolate"):
        text += " Alphas outside [0, 1] extrapolate beyond the inputs."
    return text


def matching_sentences(recipe: dict) -> str:
    """How the inputs were matched, when they differ in layout, tensors or vocabulary (the
    recipe's `matching`), in words; empty otherwise."""
    matching = recipe.get("matching") or {}
    roles = [e.get("role") for e in recipe.get("inputs", [])]
    keeps = "trained" if "trained" in roles else (roles or ["the first input"])[0]
    parts = []
    if matching.get("layouts"):
        kinds = ", ".join(f"{role} {kind}" for role, kind in matching["layouts"].items())
        parts.append(
            f" The inputs hold one text model under different tensor names ({kinds}); tensors "
            f"were matched by name and the output keeps {keeps}'s layout."
        )
    for role, names in (matching.get("without_counterpart") or {}).items():
        parts.append(f" {role.capitalize()}'s {names} had no counterpart in the other input.")
    vocabulary = matching.get("vocabulary")
    if vocabulary and not recipe.get("tokenizer"):  # a merged tokenizer says where rows come from
        rows = ", ".join(f"{count} in {role}" for role, count in vocabulary["rows"].items())
        parts.append(
            f" The vocabulary differs ({rows} rows of {', '.join(vocabulary['tensors'])}): the "
            f"{vocabulary['shared_rows']} rows both have were treated as above, the others come "
            "from trained."
        )
    return "".join(parts)


def tokenizer_sentence(recipe: dict) -> str:
    """Which tokenizer a merge wrote and where the rows of tokens some input lacks came from
    (the recipe's `tokenizer`), in words; empty when it copied its donor's."""
    tokenizer = recipe.get("tokenizer")
    if not tokenizer:
        return ""
    text = (
        f" The tokenizer was built from `{tokenizer['source']}` ({tokenizer['tokens']} tokens, "
        f"{tokenizer['rows']} embedding rows)"
    )
    added = tokenizer.get("added_rows") or {}
    if not added:
        return text + "; every input has every token."
    counts = ", ".join(f"{count} from {source}" for source, count in added.items())
    return text + f"; rows of tokens some input lacks: {counts}."


def _l2sp_sentence(recipe: dict) -> str:
    """What the L2-SP lambdas of a training run mean (their form), when it used L2-SP."""
    config = recipe.get("config") or {}
    if not config.get("l2sp"):
        return ""
    half = config.get("l2sp_form") == "half"
    penalty = "lambda / 2 * ||w - w0||^2" if half else "lambda * ||w - w0||^2"
    return f" L2-SP toward the base: `{config['l2sp']}`, penalty {penalty} per optimizer step."


def _front_matter(recipe: dict) -> str:
    """The card's YAML front matter, written by huggingface_hub's own `ModelCardData`."""
    from huggingface_hub import ModelCardData

    hub_inputs = [e["repo_id"] for e in recipe.get("inputs", []) if e.get("repo_id")]
    relation = None
    adapter = recipe.get("operation") == "extract-lora"
    if adapter:  # an adapter's base model is BASE alone
        bases = [e for e in recipe["inputs"] if e["role"] == "base"]
        hub_inputs = [e["repo_id"] for e in bases if e.get("repo_id")]
        relation = "adapter"
    elif hub_inputs:
        relation = "finetune" if recipe.get("operation") == "train" else None
        if relation is None and len(recipe.get("inputs", [])) > 1:
            relation = "merge"
    data = ModelCardData(
        base_model=list(dict.fromkeys(hub_inputs)) or None,
        base_model_relation=relation,
        library_name="peft" if adapter else "transformers",
        license=recipe.get("license"),
        tags=["checkpoint-surgery", recipe.get("operation", "surgery")],
    )
    return "---\n" + data.to_yaml() + "\n---\n"


def input_license(folder: Path | None) -> str | None:
    """The `license` of a checkpoint folder's model card front matter, if it declares one."""
    card = folder / CARD_NAME if folder is not None else None
    if card is None or not card.is_file():
        return None
    from huggingface_hub import metadata_load

    try:
        license_id = (metadata_load(card) or {}).get("license")
    except (ValueError, yaml.YAMLError):
        return None  # a malformed card of an input is not a reason to fail the operation
    return license_id if isinstance(license_id, str) else None


def _results_table(results: dict) -> list[str]:
    metrics = results.get("metrics", results)
    rows = [
        f"| {name} | {value:.4g} |"
        for name, value in metrics.items()
        if isinstance(value, int | float) and not name.endswith("/n")
    ]
    return ["## Evaluation", "", "| metric | value |", "|---|---|", *rows, ""] if rows else []


def render_card(recipe: dict, title: str, results: dict | None = None) -> str:
    """The model card text for an output made by `recipe`.

    Args:
        recipe: the recipe the operation recorded (surgery_recipe.json).
        title: the model's name (the output folder or the Hub repository).
        results: an eval results JSON (`{"metrics": {...}}`), shown as a table when given.
    """
    inputs = [
        f"| {e['role']} | {_name(e)} | {e.get('revision', 'local')} |"
        for e in recipe.get("inputs", [])
    ]
    lines = [
        _front_matter(recipe),
        f"# {title}",
        "",
        f"Made with checkpoint-surgery {recipe.get('version', '')} "
        f"(`surgery {recipe.get('operation')}`).",
        "",
        describe_operation(recipe) + matching_sentences(recipe) + tokenizer_sentence(recipe),
        "",
        "## Inputs",
        "",
        "| role | checkpoint | revision |",
        "|---|---|---|",
        *inputs,
        "",
        "## Recipe",
        "",
        "```yaml",
        yaml.safe_dump(public_recipe(recipe), sort_keys=True).rstrip(),
        "```",
        "",
        *_results_table(results or {}),
    ]
    return "\n".join(lines).rstrip() + "\n"


def card_for_folder(folder: Path, title: str) -> str | None:
    """The card of a folder this tool made (None when it has no recipe), with its eval results."""
    recipe_path = folder / RECIPE_NAME
    if not recipe_path.is_file():
        return None
    results_path = folder / RESULTS_NAME
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    return render_card(json.loads(recipe_path.read_text()), title, results)
