"""A suite file: the study named once (families of languages, tasks with per-language paths).

    families:
      slavic: {held_in: [ces_Latn, pol_Latn], held_out: [hsb_Latn]}
    languages:                       # overrides and additions to the built-in code map
      hsb_Latn: {lang2: hsb}
    tasks:
      ppl: {path: "madlad/data/{lang2}/"}
      belebele: {path: "belebele/{lang}.jsonl", shots: 2}
      flores: {dir: "flores_plus/", directions: ["eng_Latn-{lang}", "{lang}-eng_Latn"]}
      copain: {n: 150}
      arc: "lm-eval:arc_easy:shots=0"
    root: data/                      # optional, from the suite file's folder (default: cwd)
    others: [eng_Latn]               # optional: languages in no family (the base's own)

A task entry is a mapping (``kind``, default the entry's key; ``path`` or, for flores, ``dir``,
or a Hub dataset: ``dataset``, ``config``, ``split``, ``revision``; flores ``directions``; every
other key an option of the kind, as in a task string) or a task string. Paths, datasets, task
strings and directions are templates over the language's variables: ``{lang}`` (its FLORES-200
code), ``{lang_lower}`` (the code in lower case), ``{lang2}`` (its MADLAD-400 code) and any
variable given under ``languages:``. A task whose templates name a variable runs once per
language of the suite; one that names none runs once (copain, most lm-eval tasks). Languages
under ``others:`` belong to no family: they are scored like the others and reported per
language, but enter no family's or the overall mean (a base model's own language, whose
forgetting is measured).

`load_suite` checks everything once, at the boundary, into the typed values below; `plan`
expands a suite into its units. This module reads no data file and imports no torch.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from eval.errors import SuiteError, TaskSpecError
from eval.study.languages import MADLAD_CODES, is_code
from eval.tasks import KINDS, TaskSpec, argument, build_spec, parse_task

SPLITS = ("held_in", "held_out")
# The paper's five families (shipped with the package): `--suite` accepts its path.
PAPER_SUITE = Path(__file__).parent / "suites" / "paper.yml"
_KEY_RE = re.compile(r"^[\w.+-]+$")
_TOP_KEYS = {"families", "languages", "tasks", "root", "others"}


@dataclass(frozen=True)
class Family:
    """A language family: the languages trained on (held in) and their held-out relatives."""

    name: str
    held_in: tuple[str, ...]
    held_out: tuple[str, ...]


@dataclass(frozen=True)
class SuiteTask:
    """One task of a suite, as written: its templates and options (checked, not yet expanded)."""

    key: str
    kind: str
    path: str | None = None  # template; None for kinds without a path
    options: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)  # the kind's own keys (flores: directions)
    text: str | None = None  # a task-string entry (template), instead of kind/path/options
    # A Hub dataset's configs for some languages, instead of the config template: each is a unit
    # of its own, averaged into the family as a language is (Global-PIQA's regional variants).
    configs: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def templates(self) -> list[str]:
        """Every template of the entry."""
        parts = [self.text] if self.text is not None else [self.path or ""]
        return [*parts, *KINDS[self.kind].extra_templates(self.extras)]

    @property
    def per_language(self) -> bool:
        """Whether a template names a variable (the task runs once per language)."""
        return any(_fields(template) for template in self.templates())


@dataclass(frozen=True)
class Suite:
    """A parsed suite: families, each language's variables, tasks, and the data root."""

    families: tuple[Family, ...]
    variables: dict[str, dict[str, str]]  # lang -> {"lang": ..., "lang2": ..., ...}
    tasks: tuple[SuiteTask, ...]
    root: Path | None = None
    others: tuple[str, ...] = ()  # languages in no family

    def languages(self) -> list[tuple[str, str | None, str | None]]:
        """`(lang, family, split)` of every language, in file order; ``others`` last, with
        neither family nor split."""
        in_families = [
            (lang, family.name, split)
            for family in self.families
            for split in SPLITS
            for lang in getattr(family, split)
        ]
        return in_families + [(lang, None, None) for lang in self.others]

    def normalized(self) -> dict[str, Any]:
        """The suite as JSON values (results.json's ``suite``); the data root is left out, so
        the same study on data kept elsewhere is the same suite."""
        tasks: dict[str, Any] = {}
        for task in self.tasks:
            entry: dict[str, Any] = {"kind": task.kind}
            if task.text is not None:
                entry["task"] = task.text
            else:
                entry.update(path=task.path, options=dict(sorted(task.options.items())))
            entry.update(KINDS[task.kind].suite_fields(task.extras))
            if task.configs:
                entry["configs"] = {lang: list(c) for lang, c in task.configs.items()}
            tasks[task.key] = entry
        return {
            "families": {
                f.name: {"held_in": list(f.held_in), "held_out": list(f.held_out)}
                for f in self.families
            },
            "languages": self.variables,
            "tasks": tasks,
            **({"others": list(self.others)} if self.others else {}),
        }


@dataclass(frozen=True)
class Unit:
    """One (task, language[, direction][, few-shot seed]) to score, with its task spec."""

    id: str
    task: str
    kind: str
    spec: TaskSpec
    variant: str | None = None
    lang: str | None = None
    family: str | None = None
    split: str | None = None
    fewshot_seed: int | None = None


def _fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def load_suite(path: Path) -> Suite:
    """Read and check a suite file.

    Raises:
        SuiteError: not YAML, an unknown key, a bad language code, a language in two places,
            a template naming a variable some language lacks, a bad task entry.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"{path}: no such suite file") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise SuiteError(f"{path}: not a readable YAML file: {error}") from None
    where = str(path)
    data = _mapping(data, where)
    _only(data, _TOP_KEYS, where)
    families = _families(data.get("families"), where)
    languages = [lang for family in families for split in SPLITS for lang in getattr(family, split)]
    others = _codes(data.get("others", []), f"{where}: others")
    for code in others:
        if code in languages or others.count(code) > 1:
            raise SuiteError(f"{where}: others: {code} is already in the suite")
    languages += others
    variables = _variables(languages, data.get("languages") or {}, where)
    tasks = tuple(
        _task(key, entry, where)
        for key, entry in _mapping(data.get("tasks"), f"{where}: tasks").items()
    )
    if not tasks:
        raise SuiteError(f"{where}: tasks: name at least one task")
    for task in tasks:
        _check_templates(task, variables, where)
    root = data.get("root")
    if root is not None and not isinstance(root, str):
        raise SuiteError(f"{where}: root must be a folder path")
    root_path = path.parent / root if root is not None else None
    return Suite(families, variables, tasks, root_path, others)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise SuiteError(f"{where}: expected a non-empty mapping")
    if not all(isinstance(key, str) for key in value):
        raise SuiteError(f"{where}: keys must be strings")
    return value


def _only(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SuiteError(
            f"{where}: unknown key {unknown[0]!r}; expected {', '.join(sorted(allowed))}"
        )


def _families(value: Any, where: str) -> tuple[Family, ...]:
    families, seen = [], {}
    for name, entry in _mapping(value, f"{where}: families").items():
        at = f"{where}: family {name}"
        entry = _mapping(entry, at)
        _only(entry, set(SPLITS), at)
        lists = {split: _codes(entry.get(split, []), f"{at}: {split}") for split in SPLITS}
        if not lists["held_in"] and not lists["held_out"]:
            raise SuiteError(f"{at}: no language")
        for split, codes in lists.items():
            for code in codes:
                if code in seen:
                    raise SuiteError(f"{at}: {code} is already in {seen[code]}")
                seen[code] = f"family {name} ({split})"
        families.append(Family(name, lists["held_in"], lists["held_out"]))
    return tuple(families)


def _codes(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(code, str) for code in value):
        raise SuiteError(f"{where}: expected a list of language codes")
    for code in value:
        if not is_code(code):
            raise SuiteError(f"{where}: {code!r} is not a FLORES-200 code such as ces_Latn")
    return tuple(value)


def _variables(languages: Sequence[str], overrides: Any, where: str) -> dict[str, dict[str, str]]:
    if not isinstance(overrides, dict):
        raise SuiteError(f"{where}: languages: expected a mapping of code -> variables")
    unknown = [code for code in overrides if code not in languages]
    if unknown:
        raise SuiteError(f"{where}: languages: {unknown[0]} is in no family and not in others")
    result = {}
    for lang in languages:
        given = overrides.get(lang) or {}
        if not isinstance(given, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in given.items()
        ):
            raise SuiteError(f"{where}: languages: {lang}: expected variable: value pairs")
        if "lang" in given:
            raise SuiteError(f"{where}: languages: {lang}: 'lang' is the code itself")
        variables = {"lang": lang}
        if lang in MADLAD_CODES:
            variables["lang2"] = MADLAD_CODES[lang]
        variables.update({key: str(value) for key, value in given.items()})
        result[lang] = dict(sorted(variables.items()))
    return result


def _task(key: str, entry: Any, where: str) -> SuiteTask:
    at = f"{where}: task {key}"
    if not _KEY_RE.match(key):
        raise SuiteError(f"{at}: use letters, digits, '_', '.', '+' or '-' in task names")
    if isinstance(entry, str):
        kind = entry.partition(":")[0].strip().lower()
        if kind not in KINDS:
            raise SuiteError(f"{at}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        return SuiteTask(key, kind, text=entry)
    if entry is not None and not isinstance(entry, dict):
        raise SuiteError(f"{at}: expected a mapping (kind, path, options) or a task string")
    entry = dict(entry or {})
    configs = _configs(entry.pop("configs", {}), at, "dataset" in entry)
    kind = str(entry.pop("kind", key)).lower()
    if kind not in KINDS:
        raise SuiteError(f"{at}: unknown kind {kind!r}; give kind: one of {', '.join(KINDS)}")
    try:
        path, extras = KINDS[kind].suite_entry(entry)
    except ValueError as error:
        raise SuiteError(f"{at}: {error}") from None
    if "name" in entry:
        raise SuiteError(f"{at}: the task's name is its key; drop name:")
    if path is not None and not isinstance(path, str):
        raise SuiteError(f"{at}: path must be a string")
    return SuiteTask(key, kind, path, entry, extras, configs=configs)


def _configs(value: Any, at: str, dataset: bool) -> dict[str, tuple[str, ...]]:
    """``configs: {LANG: [CONFIG, ...]}`` of a dataset entry."""
    if not value:
        return {}
    if not dataset:
        raise SuiteError(f"{at}: configs: needs dataset:")
    if not isinstance(value, dict) or not all(
        isinstance(names, list) and names and all(isinstance(n, str) for n in names)
        for names in value.values()
    ):
        raise SuiteError(f"{at}: configs: expected LANG: [CONFIG, ...]")
    return {str(lang): tuple(names) for lang, names in value.items()}


def _check_templates(task: SuiteTask, variables: dict[str, dict[str, str]], where: str) -> None:
    """Expand the task for every language (or once) so bad templates or options fail now."""
    at = f"{where}: task {task.key}"
    for template in task.templates():
        try:
            _fields(template)
        except ValueError as error:  # an unmatched brace
            raise SuiteError(f"{at}: bad template {template!r}: {error}") from None
    wrong = KINDS[task.kind].check_suite(task.per_language)
    if wrong:
        raise SuiteError(f"{at}: {wrong}")
    for lang_vars in variables.values() if task.per_language else [{}]:
        lang_vars = derived(lang_vars)
        for template in task.templates():
            missing = [name for name in _fields(template) if name not in lang_vars]
            if missing:
                lang = lang_vars.get("lang", "")
                hint = f"add languages: {{{lang}: {{{missing[0]}: ...}}}}" if lang else ""
                raise SuiteError(
                    f"{at}: {template!r} uses {{{missing[0]}}}, which "
                    + (f"language {lang} does not define; {hint}" if lang else "needs a language")
                )
        try:
            _specs(task, lang_vars, None)
        except TaskSpecError as error:
            raise SuiteError(f"{at}: {error}") from None


def derived(lang_vars: dict[str, str]) -> dict[str, str]:
    """A language's variables plus those derived from its code: ``{lang_lower}`` (Global-PIQA's
    configs are lowercase codes, ``eng_latn``)."""
    if "lang" not in lang_vars or "lang_lower" in lang_vars:
        return lang_vars
    return {**lang_vars, "lang_lower": lang_vars["lang"].lower()}


def _specs(
    task: SuiteTask, lang_vars: dict[str, str], root: Path | None
) -> list[tuple[str | None, str | None, TaskSpec]]:
    """`(variant, direction, spec)` of a task for one language (or the one language-free run)."""
    lang_vars = derived(lang_vars)
    lang = lang_vars.get("lang")
    label = f"{task.key}/{lang}" if lang else task.key
    kind = KINDS[task.kind]
    if task.text is not None:
        spec = parse_task(task.text.format_map(lang_vars))
        if spec.options["name"] not in (spec.kind, task.key):
            raise TaskSpecError(f"task {spec.text!r}: the task's name is its key; drop name=")
        # Options already checked and converted by parse_task: only the name and root change.
        options = {**spec.options, "name": task.key}
        return [(None, None, replace(spec, path=kind.rooted(spec.path, root), options=options))]
    options = {**task.options, "name": task.key}
    path, dataset = argument(label, task.path.format_map(lang_vars) if task.path else "")
    path = kind.rooted(path, root)
    expansions = kind.expand(options, lang_vars, task.extras)
    if dataset is None or lang not in task.configs:
        return [
            (variant, direction, build_spec(task.kind, path, expanded, label, dataset))
            for variant, direction, expanded in expansions
        ]
    # One unit per config, named by it (the id's last part), on the language's axis.
    return [
        (
            variant,
            config,
            build_spec(task.kind, path, expanded, label, replace(dataset, config=config)),
        )
        for variant, _, expanded in expansions
        for config in task.configs[lang]
    ]


def is_fewshot(spec: TaskSpec) -> bool:
    """Whether a task draws demonstrations (repeated once per ``--fewshot-seeds`` seed); an
    lm-eval task with its own default shot count counts as few-shot."""
    if "shots" not in spec.options:
        return False
    return spec.options["shots"] is None or spec.options["shots"] > 0


def plan(suite: Suite, fewshot_seeds: Sequence[int] | None = None) -> list[Unit]:
    """The suite's units in scoring order: tasks in file order, then languages, directions and
    seeds.

    Args:
        suite: a loaded suite.
        fewshot_seeds: repeat every few-shot unit once per seed (None: once, no seed). The seed
            is the unit's run seed and, where the kind has one, its ``fewshot_seed`` option. A
            task whose demonstrations are the first rows (sampler first_n) is kept once as the
            control, beside copies named ``<task>_rs`` that draw them with lm-eval's seeded
            ``default`` sampler, one per seed (the paper's ``scripts/make_rs_tasks.py``).
    """
    units = []
    for task in suite.tasks:
        places = suite.languages() if task.per_language else [(None, None, None)]
        for lang, family, split in places:
            lang_vars = suite.variables[lang] if lang else {}
            for variant, direction, spec in _specs(task, lang_vars, suite.root):
                for key, seed, options in _copies(spec, fewshot_seeds, task.key):
                    base = "/".join(part for part in (key, lang, direction) if part)
                    unit_id = base if seed is None else f"{base}/seed={seed}"
                    seeded = replace(spec, text=unit_id, options=options)
                    units.append(
                        Unit(unit_id, key, spec.kind, seeded, variant, lang, family, split, seed)
                    )
    return units


# The suffix of the seeded copies of a first_n task (the reference's random-sampler tasks).
RANDOM_SAMPLER_SUFFIX = "_rs"


def _copies(
    spec: TaskSpec, fewshot_seeds: Sequence[int] | None, key: str
) -> list[tuple[str, int | None, dict[str, Any]]]:
    """`(task key, seed, options)` of each unit a spec becomes under ``--fewshot-seeds``."""
    if not fewshot_seeds or not is_fewshot(spec):
        return [(key, None, spec.options)]
    sampler = spec.options.get("sampler") or KINDS[spec.kind].sampler
    if sampler != "first_n":
        return [(key, seed, _seeded(spec, seed)) for seed in fewshot_seeds]
    copy = key + RANDOM_SAMPLER_SUFFIX
    seeded = [
        (copy, seed, {**spec.options, "name": copy, "sampler": "default", "fewshot_seed": seed})
        for seed in fewshot_seeds
    ]
    return [(key, None, spec.options), *seeded]


def _seeded(spec: TaskSpec, seed: int | None) -> dict[str, Any]:
    if seed is None or "fewshot_seed" not in spec.options:
        return spec.options
    return {**spec.options, "fewshot_seed": seed}
