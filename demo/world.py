"""A small synthetic multilingual world, deterministic from a seed, for the offline demo.

- A "general" language (`gen`): the base model's language.
- Five families. Each has a proto-lexicon (one root per concept) and a word order; each of its
  languages derives every word from the family's root by regular sound and spelling changes
  (k -> ch, a -> e, final vowel dropped, ...), so relatives share roots and differ regularly.
  Two languages per family are trained on; a third, the held-out relative, never is.
- Parallel sentences: one sequence of concepts per sentence, rendered in every language, so
  translation from `gen` can be scored, and perplexity measured on held-in and held-out text.

Nothing is downloaded; the same seed gives byte-identical files.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

CONSONANTS = "ptkbdgmnslrvfhz"
VOWELS = "aeiou"
FAMILIES = ("slavic", "germanic", "indic", "austro", "romance")

# Concepts by role; a sentence is [adjective] subject verb [adjective] object [place].
SUBJECTS = [f"s{i}" for i in range(16)]
VERBS = [f"v{i}" for i in range(14)]
OBJECTS = [f"o{i}" for i in range(20)]
ADJECTIVES = [f"a{i}" for i in range(10)]
PLACES = [f"p{i}" for i in range(8)]
PARTICLES = ["LOC", "DEF"]  # a locative marker and a definite article
CONCEPTS = SUBJECTS + VERBS + OBJECTS + ADJECTIVES + PLACES + PARTICLES

# Regular sound and spelling changes; each language applies a few, in order.
SOUND_CHANGES: list[tuple[str, str]] = [
    ("k", "ch"),
    ("p", "f"),
    ("t", "th"),
    ("b", "v"),
    ("d", "z"),
    ("g", "j"),
    ("s", "sh"),
    ("a", "e"),
    ("o", "u"),
    ("i", "y"),
    ("e", "ei"),
    ("u", "ou"),
    ("r", "l"),
    ("m", "n"),
]
SUFFIXES = ["", "a", "en", "ik", "o", "us"]


@dataclass(frozen=True)
class Language:
    """A language: its code, family (None for gen), word order, and a word per concept."""

    code: str
    family: str | None
    order: str  # "SVO", "SOV" or "VSO"
    lexicon: dict[str, str]
    held_out: bool = False

    @property
    def flores(self) -> str:
        """The language's FLORES-200-style code, as a suite names it: `gen_Latn` for gen, and
        per family three letters from its name with a, b, c for its languages (`sla_Latn`,
        `slb_Latn`, `slc_Latn`: slc is the held-out relative)."""
        if self.family is None:
            return f"{self.code}_Latn"
        return f"{self.code[:2]}{'abc'[int(self.code[3]) - 1]}_Latn"

    def render(self, concepts: tuple[str, ...]) -> str:
        """A sentence from (adj_s|None, subject, verb, adj_o|None, object, place|None)."""
        adj_s, subj, verb, adj_o, obj, place = concepts
        words = {
            "S": self._phrase(adj_s, subj),
            "V": [self.lexicon[verb]],
            "O": self._phrase(adj_o, obj),
        }
        sentence = [w for role in self.order for w in words[role]]
        if place is not None:
            sentence += [self.lexicon["LOC"], self.lexicon[place]]
        return " ".join(sentence) + " ."

    def _phrase(self, adjective: str | None, noun: str) -> list[str]:
        phrase = [self.lexicon["DEF"]]
        if adjective is not None:
            phrase.append(self.lexicon[adjective])
        return [*phrase, self.lexicon[noun]]


def _root(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))


def _lexicon(rng: random.Random) -> dict[str, str]:
    words: dict[str, str] = {}
    used: set[str] = set()
    for concept in CONCEPTS:
        syllables = 1 if concept in PARTICLES else rng.choice((2, 2, 3))
        word = _root(rng, syllables)
        while word in used:
            word = _root(rng, syllables)
        used.add(word)
        words[concept] = word
    return words


def _derive(proto: dict[str, str], rng: random.Random) -> dict[str, str]:
    """Apply 3 regular sound changes and a noun suffix to every proto-root."""
    changes = rng.sample(SOUND_CHANGES, 3)
    suffix = rng.choice(SUFFIXES)
    derived = {}
    for concept, root in proto.items():
        word = root
        for old, new in changes:
            word = word.replace(old, new)
        if concept[0] in "so" and concept not in PARTICLES:
            word += suffix
        derived[concept] = word
    return derived


def build_languages(seed: int = 0) -> list[Language]:
    """gen, then per family: two trained languages and one held-out relative."""
    rng = random.Random(seed)
    languages = [Language("gen", None, "SVO", _lexicon(rng))]
    for family in FAMILIES:
        proto = _lexicon(rng)
        order = rng.choice(("SVO", "SOV", "VSO"))
        for index in range(3):
            code = f"{family[:3]}{index + 1}"
            languages.append(
                Language(code, family, order, _derive(proto, rng), held_out=index == 2)
            )
    return languages


def sentences(count: int, seed: int) -> list[tuple[str | None, ...]]:
    """`count` distinct concept tuples (adj_s, subject, verb, adj_o, object, place)."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    while len(seen) < count:
        seen.add(
            (
                rng.choice([None, *ADJECTIVES]),
                rng.choice(SUBJECTS),
                rng.choice(VERBS),
                rng.choice([None, *ADJECTIVES]),
                rng.choice(OBJECTS),
                rng.choice([None, *PLACES]),
            )
        )
    ordered = sorted(seen, key=lambda t: tuple("" if x is None else x for x in t))
    rng.shuffle(ordered)
    return ordered


@dataclass(frozen=True)
class WorldFiles:
    """Where the generated data lies."""

    root: Path
    languages: list[Language]

    @property
    def train(self) -> dict[str, Path]:
        """Training text per trained language (gen and two per family)."""
        return {
            lang.code: self.root / "train" / f"{lang.code}.txt"
            for lang in self.languages
            if not lang.held_out
        }

    @property
    def gen_ppl(self) -> Path:
        """MADLAD-style root with the general language's held-out text."""
        return self.root / "ppl_gen"

    @property
    def heldin_ppl(self) -> Path:
        """MADLAD-style root for the trained family languages (unseen sentences)."""
        return self.root / "ppl_heldin"

    @property
    def heldout_ppl(self) -> Path:
        """MADLAD-style root for the held-out relatives."""
        return self.root / "ppl_heldout"

    @property
    def flores(self) -> Path:
        """FLORES-style folder: dev/<code>.dev, devtest/<code>.devtest (FLORES-style codes)."""
        return self.root / "flores"

    @property
    def suite(self) -> Path:
        """The suite file naming the study over this world (`write_suite`)."""
        return self.root / "suite.yml"

    def ppl_root(self, lang: Language) -> Path:
        """The MADLAD-style root holding `lang`'s perplexity text."""
        if lang.family is None:
            return self.gen_ppl
        return self.heldout_ppl if lang.held_out else self.heldin_ppl


def suite_text(world: WorldFiles, copain_n: int) -> str:
    """The suite of the demo's study: the five families (two trained languages, one held-out
    relative each), gen outside them, perplexity per language, Copain, and chrF of translation
    from gen into every family language."""
    lines = ["families:"]
    for family in FAMILIES:
        members = [lang for lang in world.languages if lang.family == family]
        held_in = ", ".join(lang.flores for lang in members if not lang.held_out)
        held_out = ", ".join(lang.flores for lang in members if lang.held_out)
        lines.append(f"  {family}: {{held_in: [{held_in}], held_out: [{held_out}]}}")
    gen = next(lang for lang in world.languages if lang.family is None)
    lines += [f"others: [{gen.flores}]  # the base's language: forgetting", "languages:"]
    for lang in world.languages:
        folder = world.ppl_root(lang).relative_to(world.root)
        lines.append(f"  {lang.flores}: {{lang2: {lang.code}, ppl: {folder}}}")
    lines += [
        "tasks:",
        '  ppl: {path: "{ppl}/data/{lang2}/"}',
        f"  copain: {{n: {copain_n}, shots: 3}}",
        f"  chrf: {{kind: flores, dir: {world.flores.relative_to(world.root)}/, "
        f'directions: ["{gen.flores}-{{lang}}"], shots: 2, max_new_tokens: 40}}',
        "root: .",
    ]
    return "\n".join(lines) + "\n"


def write_suite(world: WorldFiles, copain_n: int) -> Path:
    """Write `suite_text` next to the world's data; returns its path."""
    world.suite.write_text(suite_text(world, copain_n))
    return world.suite


def _write_madlad(root: Path, lang: str, lines: list[str]) -> None:
    folder = root / "data" / lang
    folder.mkdir(parents=True, exist_ok=True)
    # Fixed mtime: the same seed gives byte-identical files.
    with (
        open(folder / f"{lang}_clean_0000.jsonl.gz", "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle,
    ):
        for start in range(0, len(lines), 4):  # documents of four sentences
            handle.write((json.dumps({"text": " ".join(lines[start : start + 4])}) + "\n").encode())


def write_world(
    root: Path,
    *,
    train_sentences: int,
    eval_sentences: int,
    seed: int = 0,
    ppl_sentences: int | None = None,
) -> WorldFiles:
    """Generate the world's text files under `root`.

    Training text and evaluation text use disjoint sentences; translation dev (demonstrations)
    and devtest (scored) splits are disjoint too. `eval_sentences` sentences make each
    translation split; perplexity text is the devtest sentences and more, `ppl_sentences` in
    all (by default as many), in documents of four: perplexity is cheap to score, and a few
    documents make a noisy figure.
    """
    languages = build_languages(seed)
    ppl_sentences = max(ppl_sentences or eval_sentences, eval_sentences)
    pool = sentences(train_sentences + eval_sentences + ppl_sentences, seed + 1)
    train_part = pool[:train_sentences]
    dev_part = pool[train_sentences : train_sentences + eval_sentences]
    ppl_part = pool[train_sentences + eval_sentences :]
    test_part = ppl_part[:eval_sentences]
    files = WorldFiles(root, languages)
    (root / "train").mkdir(parents=True, exist_ok=True)
    for lang in languages:
        if not lang.held_out:
            files.train[lang.code].write_text("\n".join(lang.render(s) for s in train_part) + "\n")
        _write_madlad(files.ppl_root(lang), lang.code, [lang.render(s) for s in ppl_part])
        for split, part in (("dev", dev_part), ("devtest", test_part)):
            (files.flores / split).mkdir(parents=True, exist_ok=True)
            lines = "\n".join(lang.render(s) for s in part) + "\n"
            (files.flores / split / f"{lang.flores}.{split}").write_text(lines)
    return files
