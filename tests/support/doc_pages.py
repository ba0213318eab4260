"""What the documentation pages name: their fenced `surgery ...` examples as argument lists, and
their inline code spans, each with its page and line (tests/test_docs_match_code.py checks them
against the code)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# A contributor guide lists what it tells the reader to create: <!-- docs-test: new NAME ... -->
_INTRODUCED = re.compile(r"<!--\s*docs-test:\s*new\s+(.*?)-->", re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)
# Shell operators that end a simple command, and redirections, whose next word is a file.
_SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
_REDIRECTIONS = {">", ">>", "<", "2>", "&>", ">&", "2>&1"}


@dataclass(frozen=True)
class Where:
    """A place on a page, for failure messages: `docs/search.md:12`."""

    page: Path
    line: int

    def __str__(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"


@dataclass(frozen=True)
class Example:
    """One `surgery` command line of a fenced shell block: the words after `surgery`."""

    where: Where
    text: str
    args: list[str]
    block: int  # the line its fenced block starts at: examples of one block run in order


@dataclass(frozen=True)
class Span:
    """One inline code span outside fenced blocks, and the other spans of its line."""

    where: Where
    text: str
    line_spans: tuple[str, ...]
    line: str


def introduced(page: Path) -> set[str]:
    """The names a page introduces (a guide's new option, file or module), which need not exist."""
    text = page.read_text(encoding="utf-8")
    return {name for found in _INTRODUCED.findall(text) for name in found.split()}


def mentions(text: str, names: set[str]) -> bool:
    """Whether `text` names one of `names`, or something inside one (`module:attr`, `module.x`)."""
    return any(re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) for name in names)


def fenced_blocks(page: Path) -> Iterator[tuple[str, int, list[str]]]:
    """(language, line number of the block's first line, its lines) of each fenced block."""
    lines = page.read_text(encoding="utf-8").splitlines()
    language, start, body = None, 0, []
    for number, line in enumerate(lines, 1):
        fence = _FENCE.match(line)
        if fence and language is None:
            language, start, body = fence.group(2) or "text", number + 1, []
        elif fence:
            yield language, start, body
            language = None
        elif language is not None:
            body.append(line)


def spans(page: Path) -> Iterator[Span]:
    """Every inline code span of a page, fenced blocks left out."""
    fenced = set()
    for _, start, body in fenced_blocks(page):
        fenced.update(range(start - 1, start + len(body) + 1))
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if number in fenced:
            continue
        found = tuple(_SPAN.findall(line))
        for text in found:
            yield Span(Where(page, number), text.strip(), found, line)


def _strip_comment(line: str) -> str:
    """The line without its shell comment: a `#` at a word's start, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def logical_lines(start: int, body: list[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of a shell block's commands: comments stripped, backslash
    continuations joined, here-documents skipped."""
    pending, first, heredoc = "", 0, None
    for number, raw in enumerate(body, start):
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        line = _strip_comment(raw).rstrip()
        if not pending:
            first = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = pending + line, ""
        marker = _HEREDOC.search(text)
        if marker:
            heredoc = marker.group(1)
            text = text[: marker.start()]
        if text.strip():
            yield first, text


def _words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    return list(lexer)


def _expand(words: list[str], variables: dict[str, str]) -> list[str]:
    """Substitute known shell variables; a word that is one variable splits into words."""
    out = []
    for word in words:
        whole = _VARIABLE.fullmatch(word)
        name = whole and (whole.group(1) or whole.group(2))
        if name in variables:
            out.extend(variables[name].split())
            continue
        out.append(_VARIABLE.sub(lambda m: variables.get(m[1] or m[2], m[0]), word))
    return out


def simple_commands(text: str, variables: dict[str, str]) -> Iterator[list[str]]:
    """The simple commands of one logical line, variables expanded; assignments are recorded
    in `variables` (the block's and the page's later lines see them)."""
    command: list[str] = []
    words = iter(_words(text))
    for word in words:
        if word in _REDIRECTIONS:
            next(words, None)
        elif word in _SEPARATORS:
            yield from _finish(command, variables)
            command = []
        else:
            command.append(word)
    yield from _finish(command, variables)


def _finish(command: list[str], variables: dict[str, str]) -> Iterator[list[str]]:
    while command and (assignment := _ASSIGNMENT.match(command[0])):
        variables[assignment.group(1)] = _expand([assignment.group(2)], variables)[0]
        command = command[1:]
    if command:
        yield _expand(command, variables)


def examples(page: Path) -> Iterator[Example]:
    """Every `surgery ...` command of the page's bash blocks (`torchrun ... --no-python surgery
    train ...` gives what follows `surgery`)."""
    variables: dict[str, str] = {}
    for language, start, body in fenced_blocks(page):
        if language not in ("bash", "sh", "shell", "console"):
            continue
        for number, text in logical_lines(start, body):
            for words in simple_commands(text, variables):
                if "surgery" in words:
                    args = words[words.index("surgery") + 1 :]
                    yield Example(Where(page, number), text.strip(), args, start)
