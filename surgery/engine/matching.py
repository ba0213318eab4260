"""Matching: the tensors of several checkpoints paired by canonical name (`naming`), validated
before any plan is made. Every command that reads two or more checkpoints matches them here.

The first checkpoint is the reference (TRAINED, or a soup's first expert): its names and layout
are the output's. Tensors of the text model must be in every input; tensors outside it (a
multimodal checkpoint's vision tower and projector) may lack a counterpart where the command
says what happens to them (`lonely`), and are refused otherwise. Shapes must agree, except the
rows of a vocabulary that grew (or shrank) where the command allows it (`vocabulary`): the
embedding and head rows the configs' vocabulary sizes give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from surgery.core.errors import MismatchError
from surgery.engine.naming import (
    TEXT_ONLY,
    Layout,
    groups,
    layout_of,
    text_model_type,
    vocab_rows,
)
from surgery.engine.progress import notice
from surgery.engine.reader import Checkpoint, TensorInfo


@dataclass(frozen=True)
class Matching:
    """Tensors paired by canonical name, in the reference's (the first input's) order.

    `partners[i]` maps each reference name to input i's tensor of the same canonical name
    (absent when input i has none); `lonely[i]` lists input i's names without a counterpart
    (for the reference: its names that some input lacks); `rows` maps the reference names whose
    row counts differ to the rows every input has.
    """

    checkpoints: tuple[Checkpoint, ...]
    layouts: tuple[Layout, ...]
    partners: tuple[dict[str, TensorInfo], ...]
    lonely: tuple[tuple[str, ...], ...]
    rows: dict[str, int]

    def partner(self, name: str, index: int) -> TensorInfo | None:
        """Input `index`'s tensor matched with the reference's `name`, or None."""
        return self.partners[index].get(name)

    @property
    def renamed(self) -> bool:
        """Whether some input names the tensors otherwise than the reference."""
        return len({layout.kind for layout in self.layouts}) > 1

    @property
    def exact(self) -> bool:
        """Whether every input has the reference's names and shapes (as tools that match by
        name, mergekit among them, need)."""
        return not (self.renamed or self.rows or any(self.lonely))

    def record(self, roles: Sequence[str]) -> dict | None:
        """What the recipe records when the inputs differ in layout, tensors or vocabulary."""
        if self.exact:
            return None
        entry: dict[str, object] = {}
        if self.renamed:
            entry["layouts"] = {
                role: layout.kind for role, layout in zip(roles, self.layouts, strict=True)
            }
        lonely = {role: groups(names) for role, names in zip(roles, self.lonely, strict=True)}
        if any(self.lonely):
            entry["without_counterpart"] = {role: text for role, text in lonely.items() if text}
        if self.rows:
            first = next(iter(self.rows))
            entry["vocabulary"] = {
                "tensors": list(self.rows),
                "rows": {
                    role: self.partner(first, i).shape[0]
                    for i, role in enumerate(roles)
                    if self.partner(first, i) is not None
                },
                "shared_rows": self.rows[first],
            }
        return entry


def _labelled(label: str, layout: Layout) -> str:
    """How a message names an input: its label, with its layout unless it is text-only."""
    return label if layout.kind == TEXT_ONLY else f"{label} ({layout.kind})"


def _refuse_names(
    pair: tuple[Checkpoint, Checkpoint],
    labels: tuple[str, str],
    missing: list[str],
    extra: list[str],
    lonely_allowed: bool,
    layouts: tuple[Layout, Layout],
) -> None:
    """Refuse tensors one input has and the other lacks, unless they are outside the text model
    of one text model and the command has a rule for them."""
    (ref, other), (ref_label, label) = pair, labels
    if not (missing or extra):
        return
    types = (text_model_type(ref.config), text_model_type(other.config))
    text_missing = [n for n in missing if n not in layouts[0].others]
    text_extra = [n for n in extra if n not in layouts[1].others]
    if types[0] != types[1]:
        raise MismatchError(
            f"{ref_label} and {label} are different architectures "
            f"({types[0] or 'unknown'}, {types[1] or 'unknown'})"
        )
    if None in types and not (text_missing or text_extra):  # no config: not known as one model
        text_missing, text_extra = missing, extra
    if text_missing or text_extra:
        parts = []
        if text_missing:
            parts.append(f"only in {ref_label}: {_preview(text_missing)}")
        if text_extra:
            parts.append(f"only in {label}: {_preview(text_extra)}")
        raise MismatchError(f"{ref_label} and {label} have different tensors: {'; '.join(parts)}")
    if not lonely_allowed:
        holder, names = (ref_label, missing) if missing else (label, extra)
        lacker = label if missing else ref_label
        raise MismatchError(
            f"{holder} has {len(names)} tensors that {lacker} lacks ({groups(names)}); every "
            "input must hold the same tensors, so a multimodal and a text-only checkpoint are "
            "not averaged together"
        )


def _preview(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _is_vocabulary(a: TensorInfo, b: TensorInfo, ca: Checkpoint, cb: Checkpoint) -> bool:
    """Whether two tensors differ only in rows, as many as each config's vocabulary size."""
    return (
        len(a.shape) >= 1
        and a.shape[1:] == b.shape[1:]
        and a.shape[0] == vocab_rows(ca.config)
        and b.shape[0] == vocab_rows(cb.config)
    )


def _check_pair(
    tensor: TensorInfo,
    theirs: TensorInfo,
    checkpoints: tuple[Checkpoint, Checkpoint],
    labels: tuple[str, str],
    *,
    vocabulary: bool,
    float_dtypes_may_differ: bool,
    vocabulary_hint: str = "",
) -> bool:
    """Check one matched pair; return whether their row counts differ (a vocabulary)."""
    (ref_label, label), name = labels, tensor.name
    grown = False
    if theirs.shape != tensor.shape:
        shapes = f"{name!r} has shape {list(tensor.shape)} in {ref_label} but {list(theirs.shape)}"
        if not _is_vocabulary(tensor, theirs, *checkpoints):
            raise MismatchError(f"{shapes} in {label}")
        if not vocabulary:
            raise MismatchError(
                f"{shapes} in {label}: their vocabularies differ ({tensor.shape[0]} and "
                f"{theirs.shape[0]} rows); only checkpoints with one vocabulary are averaged"
                + (f": {vocabulary_hint}" if vocabulary_hint else "")
            )
        grown = True
    float_ok = float_dtypes_may_differ and tensor.is_float and theirs.is_float
    if theirs.dtype != tensor.dtype and not float_ok:
        raise MismatchError(
            f"{name!r} is {tensor.dtype} in {ref_label} but {theirs.dtype} in {label}; "
            "pass --dtype to choose the output's dtype"
        )
    return grown


def match(
    checkpoints: Sequence[Checkpoint],
    labels: Sequence[str],
    *,
    float_dtypes_may_differ: bool,
    vocabulary: bool = False,
    lonely: str | None = None,
    renames: bool = True,
    announce: bool = True,
    vocabulary_hint: str = "",
) -> Matching:
    """Pair the tensors of `checkpoints` (the first is the reference) by canonical name.

    Args:
        labels: how messages name each input (`trained`, `base`, `expert 2 (path)`).
        float_dtypes_may_differ: float tensors may differ in dtype (--dtype sets the output's).
        vocabulary: embedding and head rows may differ (a grown vocabulary).
        lonely: what the command does with tensors outside the text model that lack a
            counterpart, said in a note naming them; None refuses them.
        renames: whether inputs may name their tensors in other layouts.
        announce: say in a note how inputs that differ were matched (once per reference).
        vocabulary_hint: what the refusal of a vocabulary that differs says to do instead.

    Raises:
        MismatchError: different architectures, different tensors of the text model, tensors
            without counterpart where `lonely` is None, other shapes or dtypes; one line.
    """
    layouts = tuple(layout_of(c.tensors) for c in checkpoints)
    reference, ref_layout = checkpoints[0], layouts[0]
    for layout, label in zip(layouts[1:], labels[1:], strict=True):
        if not renames and layout.kind != ref_layout.kind:
            raise MismatchError(
                f"{labels[0]} is {ref_layout.kind} but {label} is {layout.kind}; this command "
                "needs both in one layout"
            )
    partners: list[dict[str, TensorInfo]] = [dict(reference.tensors)]
    lonely_names: list[list[str]] = [[]]
    rows: dict[str, int] = {}
    mine = {ref_layout.canonical[n]: n for n in reference.tensors}  # canonical -> reference's
    for other, layout, label in zip(checkpoints[1:], layouts[1:], labels[1:], strict=True):
        actual = layout.actual()
        missing = [n for c, n in mine.items() if c not in actual]
        extra = [n for c, n in actual.items() if c not in mine]
        names = (_labelled(labels[0], ref_layout), _labelled(label, layout))
        _refuse_names(
            (reference, other), names, missing, extra, lonely is not None, (ref_layout, layout)
        )
        found = {n: other.tensors[actual[c]] for c, n in mine.items() if c in actual}
        for name, theirs in found.items():
            if _check_pair(
                reference.tensors[name],
                theirs,
                (reference, other),
                (labels[0], label),
                vocabulary=vocabulary,
                float_dtypes_may_differ=float_dtypes_may_differ,
                vocabulary_hint=vocabulary_hint,
            ):
                shared = min(reference.tensors[name].shape[0], theirs.shape[0])
                rows[name] = min(rows.get(name, shared), shared)
        partners.append(found)
        lonely_names[0] = list(dict.fromkeys([*lonely_names[0], *missing]))
        lonely_names.append(extra)
    matching = Matching(
        tuple(checkpoints),
        layouts,
        tuple(partners),
        tuple(tuple(names) for names in lonely_names),
        rows,
    )
    if announce and not matching.exact:
        _note(matching, labels, lonely)
    return matching


def _note(matching: Matching, labels: Sequence[str], rule: str | None) -> None:
    """One note per run saying how the inputs were matched (shown once per reference)."""
    parts = []
    if matching.renamed:
        pairs = zip(labels, matching.layouts, strict=True)
        kinds = ", ".join(f"{label}: {layout.kind}" for label, layout in pairs)
        parts.append(f"tensors matched across layouts ({kinds})")
    for label, names in zip(labels, matching.lonely, strict=True):
        if names:
            parts.append(f"{label}'s {groups(names)} have no counterpart")
    if matching.rows:
        tensors = ", ".join(matching.rows)
        first = next(iter(matching.rows))
        counts = ", ".join(
            f"{matching.partner(first, i).shape[0]} rows in {label}"
            for i, label in enumerate(labels)
            if matching.partner(first, i) is not None
        )
        parts.append(f"the vocabulary differs ({tensors}: {counts})")
    message = "; ".join(parts) + (f": {rule}" if rule else "")
    shown = matching.checkpoints[0].notes_shown
    if message not in shown:
        shown.add(message)
        notice("note", message)
