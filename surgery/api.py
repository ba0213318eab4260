"""The Python API of the surgery commands: checkpoint arguments in, a written checkpoint out.

Arguments may be local paths or Hub ids (opened here, at the edge, before the engine sees them:
by HTTP range reads, or with `download=True` as a whole snapshot); every output gets a model
card. The engine below (`surgery.engine`) only ever sees opened checkpoints, whose shards not on
disk come with openers of byte sources, and plans.

    from surgery.api import revert
    revert("google/gemma-3-4b-pt", "ckpt/sk-dense", "out", "9:28")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from surgery.core.errors import LayerSpecError, MismatchError, SurgeryError
from surgery.engine.ops.interpolate import plan_interpolate
from surgery.engine.ops.merge.spec import MergeSpec, TokenizerSpec
from surgery.engine.ops.revert import plan_revert
from surgery.engine.ops.soup import plan_soup
from surgery.engine.output_dir import check_output
from surgery.engine.plan import Plan
from surgery.engine.progress import notice
from surgery.engine.reader import CARD_NAME, MERGEKIT_CONFIG_NAME, TRAIN_RECORD, Checkpoint
from surgery.engine.writer import execute, rereads_remote
from surgery.hub.lineage import base_role, trained_from
from surgery.hub.model_card import input_license, render_card
from surgery.hub.resolve import open_inputs
from surgery.merge_stages import (
    GRAPH_KEY,
    STAGE_KEY,
    Stage,
    check_stage_outputs,
    default_intermediate_dir,
    fingerprint,
    read_stages_file,
    remove_intermediates,
    reusable,
    stage_record,
    substitute,
)
from surgery.mergekit_config import parse_config, render_config
from surgery.options import WriteOptions

if TYPE_CHECKING:
    from surgery.engine.ops.extract_lora import LoraOptions

# The defaults; a call's keyword arguments (quiet=True, dtype="bf16", ...) change a copy.
WRITE = WriteOptions()


def write_plan(
    plan: Plan,
    out: str | Path,
    write: WriteOptions = WRITE,
    files: dict[str, bytes] | None = None,
) -> Path:
    """Check the output path against the plan's inputs, then write the checkpoint and its card
    (and `files`, a merge's tokenizer files, by name).

    Raises:
        OutputError: OUT is or lies inside an input, contains one, or exists without `force`.
    """
    out = Path(out)
    check_output(out, [ckpt.path for ckpt in plan.inputs], write.force)
    return execute(
        plan,
        out,
        quiet=write.quiet,
        max_shard_size=write.max_shard_size,
        extra_files={**(files or {}), **card_file(plan, out)},
        replace=write.force,
    )


def _no_dtype(write: WriteOptions, why: str) -> WriteOptions:
    """`write` when it names no output dtype (a command whose dtype comes from elsewhere)."""
    if write.dtype is not None:
        raise SurgeryError(f"no dtype option here: {why}")
    return write


def _open_inputs(
    specs: Sequence[str | Path], download: bool, files_from: int = -1
) -> list[Checkpoint]:
    """Open the inputs; Hub ids by ranges unless `download`. Only the input the output copies
    config and tokenizer files from (`files_from`) fetches them."""
    index = files_from % max(1, len(specs))
    companions = [i == index for i in range(len(specs))]
    return open_inputs(specs, ranges=not download, companions=companions)


def card_file(plan: Plan, out: Path) -> dict[str, str]:
    """The model card of the plan's output and, when there is one, the equivalent mergekit
    config (mergekit_config.yml), as `execute`'s extra files.

    The output keeps the license its config and tokenizer come from declares (recorded in the
    recipe, so `surgery push` regenerates the same card).
    """
    license_id = input_license(plan.files_from.folder)
    if license_id is not None:
        plan.recipe.setdefault("license", license_id)
    files = {CARD_NAME: render_card(plan.recipe, title=Path(out).name)}
    if plan.mergekit_config is not None:
        files[MERGEKIT_CONFIG_NAME] = render_config(plan.mergekit_config)
    return files


def _same(spec: str | None, checkpoint: Checkpoint | None) -> bool:
    if spec is None or checkpoint is None:
        return False
    if checkpoint.hub is not None and spec.split("@")[0] == checkpoint.hub.repo_id:
        return True
    return Path(spec).exists() and Path(spec).resolve() == checkpoint.path.resolve()


def warn_if_swapped(base: Checkpoint, trained: Checkpoint) -> str | None:
    """Warn (one line on stderr) when BASE is a training output of TRAINED or of TRAINED's base:
    BASE and TRAINED were most likely given in the wrong order. Returns the warning."""
    origin = trained_from(base.folder)
    trained_origin = trained_from(trained.folder)
    if origin is None:
        return None
    if not (_same(origin, trained) or (trained_origin and origin == trained_origin)):
        return None
    message = (
        f"BASE {base.spec} was trained from {origin} (its {TRAIN_RECORD}), which is TRAINED or "
        "TRAINED's base: are BASE and TRAINED swapped?"
    )
    notice("warning", message)
    return message


def lineage(base: Checkpoint, trained: Checkpoint) -> dict[str, str | None]:
    """BASE's role for TRAINED and the base TRAINED names (`surgery.hub.lineage.base_role`), as
    plan_revert and plan_interpolate take them; a note when BASE is a donor (a graft)."""
    role, named = base_role(base, trained)
    if role == "donor":
        notice(
            "note",
            f"TRAINED {trained.spec or trained.path} names {named} as its base, not BASE "
            f"{base.spec or base.path}: BASE is recorded as the donor of a graft",
        )
    return {"base_role": role, "trained_base": named}


def revert(
    base: str | Path,
    trained: str | Path,
    out: str | Path,
    layers: str,
    *,
    stack: str | None = None,
    modules: str | None = None,
    attention_only: bool = False,
    write: WriteOptions = WRITE,
    **changes: object,
) -> Path:
    """Write TRAINED with `layers` taken from BASE to `out`. See `plan_revert` and `write_plan`.

    Hub ids are read by ranges (only the tensors the plan needs) unless `write.download`.
    """
    write = write.with_(**changes)
    base_ckpt, trained_ckpt = _open_inputs([base, trained], write.download)
    warn_if_swapped(base_ckpt, trained_ckpt)
    plan = plan_revert(
        base_ckpt,
        trained_ckpt,
        layers,
        stack=stack,
        modules=modules,
        attention_only=attention_only,
        dtype=write.dtype,
        **lineage(base_ckpt, trained_ckpt),
    )
    return write_plan(plan, out, write)


def soup(
    experts: Sequence[str | Path],
    out: str | Path,
    weights: Sequence[float] | None = None,
    *,
    tokenizer_source: str | Path | None = None,
    write: WriteOptions = WRITE,
    **changes: object,
) -> Path:
    """Write the (weighted) average of `experts` to `out`. See `plan_soup` and `write_plan`.

    `tokenizer_source` (`union`, `base`: the first expert's, or a model) writes that tokenizer
    and lays every expert's embedding and head rows out on it, by mergekit's rules
    (`surgery.vocabulary`); without it the experts' tokenizers must agree.
    """
    write = write.with_(**changes)
    if tokenizer_source is None:
        checkpoints = _open_inputs(list(experts), write.download, files_from=0)
        labels = [f"expert {i + 1} ({c.path})" for i, c in enumerate(checkpoints)]
        _refuse_differing(checkpoints, labels, "pass --tokenizer-source (union, base or a model)")
        return write_plan(plan_soup(checkpoints, weights, dtype=write.dtype), out, write)
    from surgery.vocabulary import TOKENIZER_FILES, build_tokenizer

    # Every expert's tokenizer is read: companions of all of them.
    checkpoints = open_inputs(list(experts), ranges=not write.download)
    spec = TokenizerSpec(str(tokenizer_source))
    roles = [f"expert{i + 1}" for i in range(len(experts))]
    built = build_tokenizer(spec, [str(e) for e in experts], checkpoints, None, roles=roles)
    plan = plan_soup(checkpoints, weights, dtype=write.dtype, vocabulary=built.rows)
    return write_plan(replace(plan, omit_files=frozenset(TOKENIZER_FILES)), out, write, built.files)


def _refuse_differing(checkpoints: Sequence[Checkpoint], labels: Sequence[str], hint: str) -> None:
    """Refuse inputs whose tokenizers differ (`surgery.vocabulary.differing_vocabulary`).

    Raises:
        MismatchError: naming the inputs and what to pass instead.
    """
    from surgery.vocabulary import differing_vocabulary

    differ = differing_vocabulary(checkpoints, labels)
    if differ is not None:
        raise MismatchError(f"{differ}: {hint}")


def interpolate(
    base: str | Path,
    trained: str | Path,
    out: str | Path,
    alpha: str | float | None,
    *,
    layers: str | None = None,
    stack: str | None = None,
    modules: str | None = None,
    extrapolate: bool = False,
    beta: str | float | None = None,
    write: WriteOptions = WRITE,
    **changes: object,
) -> Path:
    """Write the interpolation of BASE and TRAINED to `out`. See `plan_interpolate`.

    `beta` (give `alpha` None) is BASE's share instead of TRAINED's, the strength of the paper's
    donor grafts: TRAINED + beta * (BASE - TRAINED).
    """
    write = write.with_(**changes)
    if (alpha is None) == (beta is None):
        raise LayerSpecError("give either alpha (TRAINED's share) or beta (BASE's share)")
    base_ckpt, trained_ckpt = _open_inputs([base, trained], write.download)
    warn_if_swapped(base_ckpt, trained_ckpt)
    plan = plan_interpolate(
        base_ckpt,
        trained_ckpt,
        alpha,
        layers=layers,
        stack=stack,
        dtype=write.dtype,
        extrapolate=extrapolate,
        modules=modules,
        beta=None if beta is None else str(beta),
        **lineage(base_ckpt, trained_ckpt),
    )
    return write_plan(plan, out, write)


def merge(
    config: str | Path,
    out: str | Path,
    *,
    seed: int = 0,
    mergekit_arithmetic: bool = False,
    intermediate_dir: str | Path | None = None,
    clean: bool = False,
    write: WriteOptions = WRITE,
    **changes: object,
) -> Path:
    """Run a mergekit YAML config on the streaming engine and write the result to `out`.

    Args:
        config: path of the YAML (mergekit's format; model paths relative to the working
            directory, or Hub ids, read by ranges unless `write.download`). Several documents
            are stages, as `mergekit-multi` runs them (see `surgery.merge_stages`).
        seed: seed of DARE and DELLA's random masks (recorded in the recipe).
        mergekit_arithmetic: compute as mergekit does, each torch operation in the config's
            `dtype` (bit-identical to `mergekit-yaml`), instead of in float32 with one rounding;
            linear and the task arithmetic methods at density 1 only (recorded in the recipe).
        intermediate_dir: where named stages write their results (default: `OUT.stages`
            beside OUT).
        clean: remove the intermediates once OUT is written.

    Raises:
        MergeConfigError: an unsupported method or key, a config mergekit rejects, or stages
            that do not form a graph with one result.
        MismatchError: the models do not line up.
    """
    write = _no_dtype(write.with_(**changes), "the config's dtype: key sets the output dtype")
    options = {"seed": seed, "mergekit_arithmetic": mergekit_arithmetic}
    stages = read_stages_file(config)
    if len(stages) == 1:
        plan, files = _merge_plan(_merge_spec(stages[0].data, options), write)
        return write_plan(plan, out, write, files)
    out = Path(out)
    folder = Path(intermediate_dir) if intermediate_dir else default_intermediate_dir(out)
    result = _run_stages(stages, out, folder, options, write)
    if clean:
        remove_intermediates(folder, stages)
    return result


def _merge_spec(data: dict, options: dict) -> MergeSpec:
    """The `MergeSpec` of one config document (`options`: seed, mergekit_arithmetic), checked
    as far as it can be before its models are opened."""
    from surgery.engine.ops.merge.planner import check_spec  # numpy: see `_merge_plan`

    spec = parse_config(render_config(data), seed=options["seed"])
    spec = replace(spec, mergekit_arithmetic=options["mergekit_arithmetic"])
    check_spec(spec)
    return spec


def _merge_plan(spec: MergeSpec, write: WriteOptions) -> tuple[Plan, dict]:
    """The plan of one document and the tokenizer files it writes (see `merge_plan`)."""
    # Companion files of every model: the planner picks which one the output copies them from.
    plan, files = merge_plan(spec, open_inputs(spec.models, ranges=not write.download))
    if not write.download and rereads_remote(plan):
        # Ranges would fetch those tensors once per pass; a download fetches them once.
        notice("note", "merge: reduction passes read inputs twice; downloading Hub inputs")
        plan, files = merge_plan(spec, open_inputs(spec.models))
    return plan, files


def _run_stages(
    stages: Sequence[Stage], out: Path, folder: Path, options: dict, write: WriteOptions
) -> Path:
    """Run the stages in order (intermediates under `folder`, reused when their fingerprint
    matches), then write OUT with the whole graph in its recipe."""
    paths = {s.name: str((folder / s.name).absolute()) for s in stages if s.name}
    # Every document is checked before anything is written: a bad last stage writes nothing.
    specs = [_merge_spec(substitute(s.data, paths), options) for s in stages]
    check_stage_outputs(stages, specs, out, folder, write.force)
    graph, digest_options = [], {**options, "max_shard_size": write.max_shard_size}
    for stage, spec in zip(stages, specs, strict=True):
        target = out if stage.name is None else folder / stage.name
        plan, files = _merge_plan(spec, write)
        digest = fingerprint(stage, digest_options, plan.inputs)
        graph.append(stage_record(stage, digest, target, plan.mergekit_config))
        if stage.name is None:
            plan.recipe[GRAPH_KEY] = graph
            return write_plan(plan, out, write, files)
        if reusable(target, stage, digest):
            notice("note", f"{stage.label}: {target} is unchanged; reused")
            continue
        notice("note", f"{stage.label}: writing {target}")
        plan.recipe[STAGE_KEY] = {"name": stage.name, "fingerprint": digest}
        write_plan(plan, target, replace(write, force=True, push_to=None), files)
    raise AssertionError("read_stages puts the unnamed stage last")


def merge_plan(spec: MergeSpec, checkpoints: Sequence[Checkpoint]) -> tuple[Plan, dict]:
    """The plan of a merge and the tokenizer files it writes (none when it copies its donor's).

    With a tokenizer to build (`tokenizer_source` or `tokenizer:`), the vocabulary map comes
    from the models' tokenizers (`surgery.vocabulary`); without one, models whose tokenizers
    differ are refused.

    Raises:
        MismatchError: tokenizers that differ without a tokenizer choice.
        MergeConfigError: a tokenizer choice that cannot be built.
    """
    from surgery.engine.ops.merge.planner import plan_merge
    from surgery.vocabulary import TOKENIZER_FILES, build_tokenizer, warn_unused_template

    if spec.tokenizer is None:
        warn_unused_template(spec.chat_template)
        labels = [f"model {m}" for m in spec.models]
        _refuse_differing(checkpoints, labels, "set tokenizer_source (union, base or a model)")
        return plan_merge(spec, checkpoints), {}
    built = build_tokenizer(spec.tokenizer, spec.models, checkpoints, spec.base, spec.chat_template)
    plan = plan_merge(spec, checkpoints, built.rows)
    return replace(plan, omit_files=frozenset(TOKENIZER_FILES)), built.files


def extract_lora(
    base: str | Path,
    trained: str | Path,
    out: str | Path,
    options: LoraOptions,
    *,
    layers: str | None = None,
    stack: str | None = None,
    modules: str | None = None,
    write: WriteOptions = WRITE,
    **changes: object,
) -> Path:
    """Write the PEFT LoRA adapter of TRAINED's change from BASE to `out` (adapter_config.json,
    adapter_model.safetensors, a card). See `plan_extract_lora` and `write_plan`."""
    write = _no_dtype(write.with_(**changes), "the adapter keeps TRAINED's dtypes")
    from surgery.engine.ops.extract_lora import plan_extract_lora  # torch: this command only

    base_ckpt, trained_ckpt = _open_inputs([base, trained], write.download)
    warn_if_swapped(base_ckpt, trained_ckpt)
    plan = plan_extract_lora(
        base_ckpt, trained_ckpt, options, layers=layers, stack=stack, modules=modules
    )
    return write_plan(plan, out, write)
