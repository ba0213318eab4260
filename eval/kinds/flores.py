"""``flores``: FLORES+/FLORES-200 translation: k-shot prompt, greedy line, corpus chrF by
sacrebleu.

Prompt (k demonstrations drawn from the same split, never the sentence being translated, or
from ``shots_split``):

    English sentence: <src>
    Indonesian sentence: <tgt>

    English sentence: <src>
    Indonesian sentence:

The model's first line after the last colon is the hypothesis (option ``postprocess``:
``first_line``, or ``reference``, the reference's cut: `eval.generation.reference_line`).
chrF is sacrebleu's corpus chrF
(character order 6, beta 2, word order 0; word order 2 for chrF++), its signature recorded.
Beside it, what the outputs look like (`eval.kinds.translation_outputs`).

In a suite a flores task names a folder (``dir``) and ``directions`` (``SRC-TGT`` templates);
each language expands to one unit per direction.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from eval.data import has_suffix, read_lines, text_sha256
from eval.errors import EvalDataError, MissingDataError, TaskSpecError, data_error
from eval.kinds.base import (
    ADD_BOS,
    REQUIRED,
    Expansion,
    Kind,
    Option,
    Settings,
    TaskSpec,
    choice,
    count,
    register,
    shots,
)
from eval.kinds.base import name as _name
from eval.kinds.shots import draw_shots
from eval.kinds.translation_outputs import output_diagnostics
from eval.published import ROW_SUFFIXES, HubSource, fetch_files, read_rows, source_config
from eval.tokens import parse_add_bos
from surgery.hub.datasets import card_configs, nearby

# A FLORES-200 language code (``xxx_Scrp``), as every layer of eval spells a language.
CODE_RE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")


def is_code(text: str) -> bool:
    """Whether `text` looks like a FLORES-200 code: three lowercase letters, ``_``, a script."""
    return bool(CODE_RE.match(text))


# FLORES-200 codes -> names used in prompts; other codes appear as themselves unless the task
# string gives src_name=/tgt_name=.
# fmt: off
LANGUAGE_NAMES = {
    "afr_Latn": "Afrikaans", "arb_Arab": "Arabic", "asm_Beng": "Assamese",
    "bel_Cyrl": "Belarusian", "ben_Beng": "Bengali", "bul_Cyrl": "Bulgarian",
    "cat_Latn": "Catalan", "ceb_Latn": "Cebuano", "ces_Latn": "Czech", "cmn_Hans": "Chinese",
    "dan_Latn": "Danish", "deu_Latn": "German", "ell_Grek": "Greek", "eng_Latn": "English",
    "eus_Latn": "Basque", "fra_Latn": "French", "glg_Latn": "Galician", "guj_Gujr": "Gujarati",
    "hin_Deva": "Hindi", "hrv_Latn": "Croatian", "ind_Latn": "Indonesian", "isl_Latn": "Icelandic",
    "ita_Latn": "Italian", "jav_Latn": "Javanese", "jpn_Jpan": "Japanese", "kor_Hang": "Korean",
    "mar_Deva": "Marathi", "mkd_Cyrl": "Macedonian", "nld_Latn": "Dutch",
    "nob_Latn": "Norwegian Bokmål", "npi_Deva": "Nepali", "ory_Orya": "Odia",
    "pan_Guru": "Punjabi", "pol_Latn": "Polish", "por_Latn": "Portuguese", "ron_Latn": "Romanian",
    "rus_Cyrl": "Russian", "sin_Sinh": "Sinhala", "slk_Latn": "Slovak", "slv_Latn": "Slovenian",
    "spa_Latn": "Spanish", "srp_Cyrl": "Serbian", "sun_Latn": "Sundanese", "swe_Latn": "Swedish",
    "tgl_Latn": "Tagalog", "tha_Thai": "Thai", "tur_Latn": "Turkish", "ukr_Cyrl": "Ukrainian",
    "urd_Arab": "Urdu", "vie_Latn": "Vietnamese", "zho_Hans": "Chinese", "zsm_Latn": "Malay",
}
# fmt: on

DEFAULT_DIRECTIONS = ("eng_Latn-{lang}", "{lang}-eng_Latn")


def find_language_file(root: Path, split: str, lang: str) -> Path:
    """Locate one language's sentences under a FLORES folder.

    Looks in `root/<split>/` then `root/` for `<lang>.<split>` (FLORES-200), `<split>.<lang>`
    (FLORES+ on GitHub), `<lang>.parquet` (FLORES+ on the Hub: ``devtest/<lang>.parquet``),
    `<lang>.jsonl`, `<lang>.jsonl.gz` and `<lang>.txt`.

    Raises:
        EvalDataError: none of them exists (the message names the languages nearby).
    """
    names = _names(split, lang)
    for folder in (root / split, root):
        for file_name in names:
            if (folder / file_name).is_file():
                return folder / file_name
    looked = ", ".join(names)
    present = {
        path.name.split(".")[0]
        for folder in (root / split, root)
        if folder.is_dir()
        for path in folder.iterdir()
        if path.is_file() and is_code(path.name.split(".")[0])
    }
    raise data_error(
        root,
        None,
        f"no {lang} file for split {split} (looked for {looked}); languages nearby: "
        + nearby(lang, present),
    )


def _names(split: str, lang: str) -> list[str]:
    return [
        f"{lang}.{split}",
        f"{split}.{lang}",
        f"{lang}.parquet",
        f"{lang}.jsonl",
        f"{lang}.jsonl.gz",
        f"{lang}.txt",
    ]


def language_file_name(files: list[str], split: str, lang: str) -> str | None:
    """`find_language_file` on a repository's file list: the name that holds a language."""
    present = set(files)
    for folder in (f"{split}/", ""):
        for file_name in _names(split, lang):
            if folder + file_name in present:
                return folder + file_name
    return None


def read_sentences(path: Path) -> dict[str, str]:
    """Sentences by id: rows with `id` and `text` (JSON lines, or FLORES+'s Parquet files), or a
    text file with one per line.

    Raises:
        EvalDataError: malformed rows, duplicate ids, empty lines, or an empty file.
    """
    if has_suffix(path, ROW_SUFFIXES):
        sentences: dict[str, str] = {}
        for row in read_rows(path):
            key = str(row.field("id"))
            if key in sentences:
                raise data_error(path, row.line, f"duplicate id {key}")
            sentences[key] = row.text("text")
        return sentences
    sentences = {}
    for line_no, line in read_lines(path):
        if not line.strip():
            # Sentences are aligned by line number: a blank line would shift every later pair.
            raise data_error(path, line_no, "empty line (one sentence per line expected)")
        sentences[str(line_no)] = line.strip()
    if not sentences:
        raise data_error(path, None, "empty: no sentences")
    return sentences


def align(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    """(source, target) pairs in the source file's order, matched by id.

    Raises:
        EvalDataError: the files do not hold the same ids.
    """
    return [(src, tgt) for _, src, tgt in align_with_ids(src_path, tgt_path)]


def align_with_ids(src_path: Path, tgt_path: Path) -> list[tuple[str, str, str]]:
    """(id, source, target) in the source file's order, matched by id (line number for text).

    Raises:
        EvalDataError: the files do not hold the same ids.
    """
    src, tgt = read_sentences(src_path), read_sentences(tgt_path)
    missing = [key for key in src if key not in tgt]
    if missing or len(src) != len(tgt):
        raise EvalDataError(
            f"{src_path} ({len(src)} sentences) and {tgt_path} ({len(tgt)}) are not aligned"
            + (f": id {missing[0]} is missing from the second" if missing else "")
        )
    return [(key, text, tgt[key]) for key, text in src.items()]


def chrf(hypotheses: list[str], references: list[str], word_order: int = 0) -> tuple[float, str]:
    """Corpus chrF (word_order 0) or chrF++ (word_order 2) by sacrebleu, with its signature.

    Args:
        hypotheses: system outputs.
        references: one reference per hypothesis.
        word_order: 0 for chrF, 2 for chrF++.

    Returns:
        `(score in 0..100, sacrebleu signature)`.
    """
    from sacrebleu.metrics import CHRF

    metric = CHRF(word_order=word_order)
    score = metric.corpus_score(hypotheses, [references]).score
    return score, str(metric.get_signature())


def _no_file(repo: str, files: list[str], card: str | None, split: str, lang: str) -> None:
    """Raise the error for a language without a file among `files`: the card names it as a
    config, so the file is on the Hub but not in the cache read offline (`EvalDataError`), or
    the dataset does not hold the language (`MissingDataError`, a suite's missing unit)."""
    configs = card_configs(card) or {}
    if lang in configs:
        raise EvalDataError(
            f"dataset {repo}: {split}/{lang} is not in the Hub cache (HF_HUB_OFFLINE set); fetch "
            f"it first: hf download --repo-type dataset {repo} --include '{split}/{lang}.*'"
        )
    present = {n.split("/")[-1].split(".")[0] for n in files if n.startswith(split)}
    raise MissingDataError(
        f"dataset {repo}, split {split}: no {lang} file; languages nearby: "
        f"{nearby(lang, present or set(configs))}"
    )


def _fetch(spec: TaskSpec, splits: list[str]) -> tuple[Path, HubSource]:
    """Fetch the two languages' files of each split of a FLORES dataset on the Hub (only
    those)."""
    assert spec.dataset is not None
    langs = (spec.options["src"], spec.options["tgt"])

    def select(files: list[str], card: str | None) -> list[str]:
        wanted = [(split, lang) for split in splits for lang in langs]
        names = [language_file_name(files, split, lang) for split, lang in wanted]
        for (split, lang), name in zip(wanted, names, strict=True):
            if name is None:
                _no_file(spec.dataset.repo, files, card, split, lang)
        return [name for name in names if name is not None]

    _, source = fetch_files(spec.dataset, spec.dataset.config, splits[0], select)
    return source.folder, source


def _aligned(
    root: Path, split: str, src_lang: str, tgt_lang: str
) -> tuple[Path, Path, list[tuple[str, str, str]]]:
    """Both languages' files of a split under a FLORES folder, and their aligned sentences."""
    src = find_language_file(root, split, src_lang)
    tgt = find_language_file(root, split, tgt_lang)
    return src, tgt, align_with_ids(src, tgt)


class TranslationTask:
    """One translation direction of FLORES, read and aligned."""

    def __init__(
        self,
        spec: TaskSpec,
        pairs: list[tuple[str, str]],
        files: list[Path],
        ids: list[str] | None = None,
    ) -> None:
        self.spec = spec
        self.pairs = pairs
        self.ids = ids or [str(index) for index in range(len(pairs))]
        self.files = files
        self.source: HubSource | None = None
        # Demonstrations from another split (FLORES+'s dev), or None: the translated split's.
        self.shot_pairs: list[tuple[str, str]] | None = None
        options = spec.options
        self.src_name = options["src_name"] or LANGUAGE_NAMES.get(options["src"], options["src"])
        self.tgt_name = options["tgt_name"] or LANGUAGE_NAMES.get(options["tgt"], options["tgt"])

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> TranslationTask:
        """Find, read and align both languages' files.

        Raises:
            EvalDataError: a file is missing, malformed, misaligned or too short for the shots.
        """
        options = spec.options
        root, split, source = spec.path, options["split"], None
        if spec.dataset is not None:
            split = spec.dataset.split or split
        shots_split = options["shots_split"] if options["shots_split"] != split else None
        if spec.dataset is not None:
            root, source = _fetch(spec, [split, *([shots_split] if shots_split else [])])
        assert root is not None  # parse_task guarantees a path or a dataset
        src, tgt, aligned = _aligned(root, split, options["src"], options["tgt"])
        pool = len(aligned) - 1  # the sentence itself is never its own demonstration
        files = [src, tgt]
        if shots_split is not None:
            shot_src, shot_tgt, shot_aligned = _aligned(
                root, shots_split, options["src"], options["tgt"]
            )
            files, pool = [*files, shot_src, shot_tgt], len(shot_aligned)
        if pool < options["shots"]:
            raise data_error(src, None, f"{pool + 1} sentences; {options['shots']}-shot needs more")
        pairs = [(text, target) for _, text, target in aligned]
        task = cls(spec, pairs, files, [key for key, _, _ in aligned])
        task.source = source
        if shots_split is not None:
            task.shot_pairs = [(text, target) for _, text, target in shot_aligned]
        return task

    def config(self) -> dict[str, Any]:
        """Files, direction, prompt names, shots, metric and generation limit."""
        options = self.spec.options
        return {
            "kind": "flores",
            "files": [str(path) for path in self.files],
            **(source_config(self.source) if self.source else {}),
            "src": options["src"],
            "tgt": options["tgt"],
            "prompt_names": [self.src_name, self.tgt_name],
            "shots": options["shots"],
            **({"shots_split": options["shots_split"]} if self.shot_pairs is not None else {}),
            "metric": options["metric"],
            "max_new_tokens": options["max_new_tokens"],
            "postprocess": options["postprocess"],
            "add_bos": options["add_bos"],
        }

    def prompts(self, count: int, seed: int) -> list[str]:
        """The k-shot prompts of the first `count` sentences."""
        blocks = []
        pool = self.shot_pairs if self.shot_pairs is not None else self.pairs
        for index in range(count):
            others = [j for j in range(len(pool)) if pool is not self.pairs or j != index]
            chosen = draw_shots(others, self.spec.options["shots"], f"flores/{seed}/{index}")
            demos = [self._block(*pool[j]) for j in chosen]
            blocks.append("\n\n".join([*demos, self._block(self.pairs[index][0], None)]))
        return blocks

    def half_items(self, limit: int | None, seed: int) -> list[int]:
        """Every sentence (among the first `limit`) may go into a half when demonstrations
        come from another split (FLORES dev) or there are none.

        Raises:
            TaskSpecError: demonstrations drawn from the translated split itself.
        """
        if self.spec.options["shots"] and self.shot_pairs is None:
            raise TaskSpecError(
                f"task {self.spec.text!r}: its demonstrations are drawn from the sentences it "
                "translates, so it cannot be split into halves; give shots_split=dev "
                "(FLORES dev as the demonstration pool) or shots=0"
            )
        return list(range(min(limit or len(self.pairs), len(self.pairs))))

    def _block(self, source: str, target: str | None) -> str:
        answer = f" {target}" if target is not None else ""
        return f"{self.src_name} sentence: {source}\n{self.tgt_name} sentence:{answer}"

    def run(self, model: Any, tokenizer: Any, settings: Settings) -> tuple[dict, dict]:
        """Translate the first `limit` sentences and score them.

        Returns:
            `({chrf or chrf++, n, the output diagnostics}, {signature})`; the diagnostics are
            `eval.kinds.translation_outputs.output_diagnostics` of the scored lines.
        """
        from eval.generation import generate  # torch, once a model scores

        count = min(settings.limit or len(self.pairs), len(self.pairs))
        kept = settings.keep(count)
        every = self.prompts(count, settings.seed)
        prompts = [every[index] for index in kept]
        generations = generate(
            model,
            tokenizer,
            prompts,
            max_new_tokens=self.spec.options["max_new_tokens"],
            max_length=settings.max_length,
            postprocess=self.spec.options["postprocess"],
            batch_size=settings.batch_size,
            progress=settings.progress,
            add_bos=parse_add_bos(self.spec.options["add_bos"]),
            desc=f"translating {self.spec.options['src']}->{self.spec.options['tgt']}",
        )
        hypotheses = [generation.line for generation in generations]
        metric = self.spec.options["metric"]
        references = [self.pairs[index][1] for index in kept]
        if settings.log is not None:
            for index, prompt, generation, reference in zip(
                kept, prompts, generations, references, strict=True
            ):
                record = {"task": self.spec.name, "index": index, "doc_id": self.ids[index]}
                record.update(prompt_sha256=text_sha256(prompt), prompt=prompt)
                # generation (the earlier name) and hypothesis are the same scored line.
                hypothesis = generation.line
                record.update(generation=hypothesis, hypothesis=hypothesis, reference=reference)
                # Why generation stopped, and what it generated before the line was cut.
                record.update(stop=generation.stop, raw_generation=generation.text)
                settings.log(record)
        score, signature = chrf(hypotheses, references, word_order=2 if metric == "chrf++" else 0)
        stops = [generation.stop for generation in generations]
        metrics = {metric: score, "n": len(kept), **output_diagnostics(hypotheses, stops)}
        return metrics, {"signature": signature}


class FloresKind(Kind):
    """A suite's flores task: a folder (``dir``) and directions instead of src/tgt."""

    def suite_entry(self, entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """``dir`` is the path; ``directions`` (default both ways with English) are kept."""
        path = self.dataset_entry(entry, "dir")
        directions = tuple(entry.pop("directions", DEFAULT_DIRECTIONS))
        for forbidden in ("src", "tgt"):
            if forbidden in entry:
                raise ValueError(f"give directions: [SRC-TGT, ...], not {forbidden}")
        return path, {"directions": directions}

    def suite_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """The directions as written."""
        return {"directions": list(extras.get("directions", ()))}

    def extra_templates(self, extras: dict[str, Any]) -> list[str]:
        """The directions are templates over the language's variables."""
        return list(extras.get("directions", ()))

    def expand(
        self, options: dict[str, Any], lang_vars: dict[str, str], extras: dict[str, Any]
    ) -> list[Expansion]:
        """One unit per direction; ``eng_Latn-{lang}`` for English itself is left out."""
        result: list[Expansion] = []
        for template in extras.get("directions", ()):
            direction = template.format_map(lang_vars)
            src, sep, tgt = direction.partition("-")
            if not sep or not is_code(src) or not is_code(tgt):
                raise TaskSpecError(f"flores direction {template!r}: expected SRC-TGT codes")
            if src == tgt:  # nothing to translate
                continue
            result.append((template, direction, {**options, "src": src, "tgt": tgt}))
        return result

    def missing(self, spec: Any) -> str | None:
        """The split folder of the first language without a file (a Hub dataset: checked when
        it is fetched)."""
        if spec.path is None:
            return None
        splits = {spec.options["split"], spec.options["shots_split"] or spec.options["split"]}
        for split in sorted(splits):
            for lang in (spec.options["src"], spec.options["tgt"]):
                try:
                    find_language_file(spec.path, split, lang)
                except EvalDataError:
                    return str(spec.path / split / lang)
        return None


KIND = register(
    FloresKind(
        "flores",
        "DIR",
        "FLORES+/FLORES-200 translation scored by chrF; DIR holds <split>/<lang>.parquet "
        "(FLORES+ as published), <lang>.<split> (FLORES-200) or <lang>.jsonl[.gz]; or "
        "hub:openlanguagedata/flores_plus[@SPLIT[@REVISION]] (gated: accept its terms, log in); "
        "only the two languages' files are fetched",
        {
            "src": Option(_name, REQUIRED, "source language code, e.g. eng_Latn"),
            "tgt": Option(_name, REQUIRED, "target language code"),
            "shots": shots(2),
            "split": Option(_name, "devtest", "split to translate and draw demonstrations from"),
            "shots_split": Option(
                _name, None, "split to draw demonstrations from instead (FLORES+'s dev)"
            ),
            "metric": Option(choice("chrf", "chrf++"), "chrf", "chrf or chrf++"),
            "max_new_tokens": Option(count(1), 256, "longest translation generated"),
            "postprocess": Option(
                choice("first_line", "reference"),
                "first_line",
                "first_line: the text before the first newline; reference: the paper's "
                "(leading whitespace skipped, also cut at a literal backslash-n)",
            ),
            "src_name": Option(str, None, "source language name in the prompt"),
            "tgt_name": Option(str, None, "target language name in the prompt"),
            "add_bos": ADD_BOS,
        },
        loader=TranslationTask.from_spec,
        hub=True,
        measure="chrf",
        primary="chrf",
    )
)
