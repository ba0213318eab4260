"""The commands that write one checkpoint: revert, soup, interpolate, merge, extract-lora.

Each parses its options, hands `surgery.api` the one `WriteOptions` value the shared decorator
built, and reports what it wrote.
"""

from __future__ import annotations

import click

from surgery.core.cli_paths import OutputFolder
from surgery.options import (
    base_trained_out,
    extrapolate_option,
    finish,
    modules_option,
    stack_option,
    write_options,
)


class MethodsHelp(click.Command):
    """A command whose help lists the merge registry's methods where it says {methods}: the
    registry is imported (with numpy) only when the help is shown."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from surgery.engine.ops.merge.registry import METHODS

        self.help = (self.help or "").replace("{methods}", ", ".join(METHODS))
        super().format_help_text(ctx, formatter)


@click.command()
@click.option(
    "--layers", required=True, help="Layers to take from BASE, e.g. 9:28, -6:, 0:9,28:34."
)
@stack_option
@modules_option
@click.option(
    "--attention-only",
    is_flag=True,
    help="The paper's attention_only: only the MLP tensors of LAYERS (names holding mlp, "
    "gate_proj, up_proj, down_proj, fc1 or fc2) come from BASE; attention and norms stay "
    "TRAINED's.",
)
@write_options()
@base_trained_out
def revert(layers, stack, modules, attention_only, write, base, trained, out):
    """Take LAYERS from BASE and everything else from TRAINED (byte copies).

    \b
    Examples:
      surgery revert --layers 9:28 base trained out          # middle 19 of 34 layers
      surgery revert --layers -6: base trained out           # the last six layers
      surgery revert --layers 0:4 --stack vision base trained out
      surgery revert --layers 9:28 --modules mlp base trained out  # only their MLPs
      surgery revert --layers 9:28 --attention-only base trained out  # the paper's
    """
    from surgery.api import revert as run

    options = {"stack": stack, "modules": modules, "attention_only": attention_only}
    finish(run(base, trained, out, layers, **options, write=write), write)


@click.command()
@click.option(
    "--weights", default=None, help="Comma-separated weights, normalized (default: uniform)."
)
@click.option(
    "--tokenizer-source",
    default=None,
    metavar="union|base|MODEL",
    help="Experts whose tokenizers differ: write the union of their tokenizers, the first "
    "expert's (base), or MODEL's, with embedding rows laid out as mergekit does (default: one "
    "vocabulary required).",
)
@write_options()
@click.argument("experts", nargs=-1, required=True, type=click.Path())
@click.argument("out", type=OutputFolder())
def soup(weights, tokenizer_source, write, experts, out):
    """Average EXPERTS (two or more) into OUT: sum(w_i * expert_i) / sum(w_i).

    Float tensors accumulate in float32 (float64 for 32-bit inputs) and are rounded once;
    non-float tensors must be identical in every expert and are copied.

    \b
    Examples:
      surgery soup experts/* out
      surgery soup slavic germanic indic out --weights 2,1,1
      surgery soup hindi-expert russian-expert out --tokenizer-source union
    """
    from surgery.api import soup as run
    from surgery.engine.ops.soup import parse_weights

    weights = parse_weights(weights, len(experts))
    finish(run(list(experts), out, weights, tokenizer_source=tokenizer_source, write=write), write)


@click.command()
@click.option(
    "--alpha", default=None, help="Weight of TRAINED: a number, or per range: 9:28=0.3,*=1.0."
)
@click.option(
    "--beta",
    default=None,
    help="Or the weight of BASE (a donor's share, the paper's graft strength): TRAINED + beta * "
    "(BASE - TRAINED), alpha = 1 - beta; a number, or per range: 9:28=0.3.",
)
@click.option(
    "--layers", default=None, help="Blend only these layers; all other tensors from TRAINED."
)
@stack_option
@modules_option
@extrapolate_option
@write_options()
@base_trained_out
def interpolate(alpha, beta, layers, stack, modules, extrapolate, write, base, trained, out):
    """Write (1 - alpha) * BASE + alpha * TRAINED.

    alpha 0 gives BASE and alpha 1 gives TRAINED, bit for bit. With per-range alphas, '*' covers
    every other layer and the tensors outside the layer stack; what no range covers comes from
    TRAINED. --beta gives BASE's share instead (alpha = 1 - beta): a graft from a donor BASE
    at the paper's strength beta.

    \b
    Examples:
      surgery interpolate --alpha 0.5 base trained out
      surgery interpolate --alpha 0.3 --layers 9:28 base trained out
      surgery interpolate --alpha 9:28=0.3,*=1.0 base trained out
      surgery interpolate --alpha 9:28=0.3,*=1.0 --modules attn base trained out
      surgery interpolate --beta 0.5 --layers 9:28 donor expert out  # half the donor's band
    """
    from surgery.api import interpolate as run

    if (alpha is None) == (beta is None):
        raise click.UsageError("give --alpha (TRAINED's share) or --beta (BASE's share), one")
    options = {"layers": layers, "stack": stack, "modules": modules, "extrapolate": extrapolate}
    finish(run(base, trained, out, alpha, beta=beta, **options, write=write), write)


@click.command(cls=MethodsHelp)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed of DARE/DELLA's random masks."
)
@click.option(
    "--mergekit-arithmetic",
    is_flag=True,
    help="Compute as mergekit does, op by op in the config's dtype (bit-identical to "
    "mergekit-yaml), not in float32 with one rounding; linear, task_arithmetic and the "
    "TIES/DARE/Breadcrumbs/DELLA variants at density 1 only.",
)
@click.option(
    "--intermediate-dir",
    type=OutputFolder(file_okay=False),
    help="Where a multi-stage CONFIG writes its named stages' results (unchanged ones are "
    "reused). [default: OUT.stages beside OUT]",
)
@click.option("--clean", is_flag=True, help="Remove the intermediate results once OUT is written.")
@write_options("max_shard_size", "force", "push_to", "quiet", "download")
@click.argument("config", type=click.Path())
@click.argument("out", type=OutputFolder())
def merge(seed, mergekit_arithmetic, intermediate_dir, clean, write, config, out):
    """Run a mergekit YAML CONFIG on the streaming engine; write the result to OUT.

    Methods: {methods}. Any key or method not supported is an error. A CONFIG of several
    YAML documents is a graph of stages, as mergekit-multi runs it: each named document is an
    intermediate result that other documents use by its name; the unnamed one is OUT.

    \b
    Examples:
      surgery merge ties.yml out
      surgery merge --seed 1 dare.yml out
      surgery merge --mergekit-arithmetic bf16-ties.yml out  # mergekit's bits
      surgery merge revert-out/mergekit_config.yml replay    # replay any output's config
      surgery merge --clean stages.yml out                   # several documents: stages
    """
    from surgery.api import merge as run

    stages = {"intermediate_dir": intermediate_dir, "clean": clean}
    options = {"seed": seed, "mergekit_arithmetic": mergekit_arithmetic, **stages}
    finish(run(config, out, **options, write=write), write)


@click.command("extract-lora")
@click.option(
    "--rank", "--max-rank", default=128, show_default=True, type=int, help="Largest LoRA rank."
)
@click.option(
    "--sv-epsilon",
    default=0.0,
    show_default=True,
    type=float,
    help="Also drop singular values at or below this (absolute, as mergekit's).",
)
@click.option("--layers", default=None, help="Only these layers (e.g. 0:9,28:34); no embeddings.")
@stack_option
@modules_option
@click.option("-i", "--include-regex", "include", multiple=True, help="Only modules matching.")
@click.option("-e", "--exclude-regex", "exclude", multiple=True, help="No modules matching.")
@click.option(
    "--embed-lora/--no-embed-lora",
    default=False,
    help="Factor the embeddings too (default: save them and the head whole).",
)
@click.option(
    "--save-module", "save_modules", multiple=True, help="Save this module whole (repeatable)."
)
@click.option("--skip-undecomposable", is_flag=True, help="Leave out norms (no 2-D weight).")
@click.option(
    "--distribute-scale/--no-distribute-scale",
    default=True,
    help="A = sqrt(S) V^T, B = U sqrt(S) (default), or A = S V^T, B = U.",
)
@click.option(
    "--svd",
    type=click.Choice(["full", "randomized"]),
    default="full",
    show_default=True,
    help="torch.linalg.svd, or torch.svd_lowrank (seeded) for large matrices.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of --svd randomized.")
@write_options("force", "push_to", "quiet", "download")
@base_trained_out
def extract_lora(
    rank,
    sv_epsilon,
    layers,
    stack,
    modules,
    include,
    exclude,
    embed_lora,
    save_modules,
    skip_undecomposable,
    distribute_scale,
    svd,
    seed,
    write,
    base,
    trained,
    out,
):
    """Write a PEFT LoRA adapter of TRAINED's change from BASE, by SVD of each weight's change.

    Loaded onto BASE (PeftModel.from_pretrained), it gives TRAINED's weights up to the singular
    values discarded beyond --rank. Embeddings, head and norms are saved whole by default.

    \b
    Examples:
      surgery extract-lora --rank 16 base trained adapter
      surgery extract-lora --rank 64 --layers -6: --modules mlp base trained adapter
      surgery extract-lora --rank 32 --svd randomized -e lm_head base trained adapter
    """
    from surgery.api import extract_lora as run
    from surgery.engine.lowrank import Solver
    from surgery.engine.ops.extract_lora import LoraOptions

    options = LoraOptions(
        rank=rank,
        sv_epsilon=sv_epsilon,
        embed_lora=embed_lora,
        save_modules=tuple(save_modules),
        include=tuple(include),
        exclude=tuple(exclude),
        skip_undecomposable=skip_undecomposable,
        solver=Solver(svd, seed, distribute_scale),
    )
    written = run(
        base,
        trained,
        out,
        options,
        layers=layers,
        stack=stack,
        modules=modules,
        write=write,
    )
    finish(written, write)


COMMANDS = [revert, soup, interpolate, merge, extract_lora]
