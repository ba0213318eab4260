"""The pages name only what exists. README.md and docs/*.md are read as a user would copy them:

- every `surgery ...` line of a bash block parses with click's own parser against the real
  `cli` group: the command exists, every option is one of its visible options and gets its
  value, and the arguments are as many as the command takes;
- an inline `surgery CMD --opt` (or `CMD --opt`) names a command and its options; an inline
  `--opt` is an option of a command named in backticks on its line, or of some command;
- a backticked path in the repository (`surgery/engine/writer.py`, `bench/bench_floor.py`,
  `docs/*.png`) exists;
- a backticked dotted name of the project (`surgery.api.revert`, `eval.study.suite.PAPER_SUITE`)
  and every import of a Python block resolve;
- (slow) the examples that run on the demo's world (`surgery-demo/...`, offline) run, each
  block's commands in order, on a quick demo built here.

No model is loaded. A failure names the page, the line and the bad token.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli import cli
from tests.support.doc_pages import (
    PAGES,
    ROOT,
    Example,
    Span,
    Where,
    examples,
    fenced_blocks,
    introduced,
    mentions,
)
from tests.support.doc_pages import spans as page_spans

PACKAGES = ("surgery", "eval", "train", "demo", "bench", "tests")
# Top-level entries of the repository a backticked path may start with.
REPO_DIRS = (*PACKAGES, "docs", ".ci")
ROOT_FILES = {"README.md", "pyproject.toml", "mkdocs.yml", "cli.py"}
_OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
_PATH = re.compile(r"^[\w.-]+(/[\w.*-]+)+/?$")
_DOTTED = re.compile(r"^(surgery|eval|train|demo)(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?(\(\))?$")
# Suffixes that make `x.py` or `demo.md` a file name rather than a Python name.
_FILE_SUFFIXES = {"py", "md", "yml", "yaml", "json", "jsonl", "png", "txt", "csv", "toml", "gz"}
_CONTEXT = click.Context(cli, info_name="surgery")
_UNSET = getattr(click.core, "UNSET", None)
# A line may name a hidden option (an old spelling) only to say that it is one.
_NAMES_AN_ALIAS = re.compile(r"alias|hidden|old spelling|deprecated|renamed", re.I)


def _commands() -> dict[str, click.Command]:
    return {name: cli.get_command(_CONTEXT, name) for name in cli.list_commands(_CONTEXT)}


COMMANDS = _commands()


def _options(command: click.Command) -> dict[str, click.Option]:
    """Every spelling of every option of `command` (hidden ones too, to name them as such)."""
    return {
        name: param
        for param in command.get_params(_CONTEXT)
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
    }


def _missing(value: object) -> bool:
    return value is None or value == () or (_UNSET is not None and value is _UNSET)


def parse_problems(args: list[str]) -> list[str]:
    """What click finds wrong in `surgery ARGS`: the group's options, the command, then the
    command's options and arguments (values are not converted: paths need not exist)."""
    args = [word for word in args if word != "..."]  # "the others likewise", as pages elide
    try:
        values, rest, _ = cli.make_parser(_CONTEXT).parse_args(args=list(args))  # it consumes
    except click.UsageError as error:
        return [error.format_message()]
    if not rest:
        return [] if values.get("version") or "--help" in args else ["no command"]
    command = COMMANDS.get(rest[0])
    if command is None:
        return [f"no command {rest[0]!r}"]
    context = click.Context(command, info_name=rest[0], parent=_CONTEXT)
    try:
        values, extra, _ = command.make_parser(context).parse_args(args=rest[1:])
    except click.UsageError as error:
        return [error.format_message()]
    problems = [f"hidden option {name}" for name in _used_options(rest[1:], command, hidden=True)]
    if "--help" in rest:
        return problems
    if extra:
        problems.append(f"unexpected extra arguments {extra}")
    problems += [
        f"missing {param.human_readable_name}"
        for param in command.params
        if param.required and _missing(values.get(param.name))
    ]
    return problems


def _used_options(words: list[str], command: click.Command, hidden: bool = False) -> list[str]:
    """The option words among `words` (`--opt` or `--opt=value`), or only the hidden ones."""
    options = _options(command)
    found = [word.split("=", 1)[0] for word in words if _OPTION.match(word)]
    return [name for name in found if not hidden or (name in options and options[name].hidden)]


def _span_command(text: str) -> tuple[click.Command, list[str]] | None:
    """(command, its words) of a span `surgery CMD ...` or `CMD --opt ...`, else None."""
    words = text.split()
    if words and words[0] == "surgery":
        words = words[1:]
    elif len(words) < 2 or not words[1].startswith("-"):
        return None
    if words and words[0] in COMMANDS:
        return COMMANDS[words[0]], words[1:]
    return None


def span_problems(span: Span) -> list[str]:
    """An inline `surgery CMD --opt` or bare `--opt` that names nothing real."""
    text = span.text
    if text.startswith("surgery ") and text.split()[1] not in COMMANDS:
        name = text.split()[1]
        return [] if name.isupper() or name.startswith("-") else [f"no command {name!r}"]
    found = _span_command(text)
    if found:
        command, words = found
        options = _options(command)
        alias_ok = bool(_NAMES_AN_ALIAS.search(span.line))
        return [
            f"{name} is not an option of {command.name}"
            if name not in options
            else f"{name} is a hidden option (an old spelling) of {command.name}"
            for name in _used_options(words, command)
            if name not in options or (options[name].hidden and not alias_ok)
        ]
    if not _OPTION.match(text):
        return []
    named = [_span_command(other) for other in span.line_spans]
    commands = [found[0] for found in named if found]
    commands += [COMMANDS[other] for other in span.line_spans if other in COMMANDS]
    names = [word.split("=", 1)[0] for word in re.split(r"[\s/,]+", text) if _OPTION.match(word)]
    alias_ok = bool(_NAMES_AN_ALIAS.search(span.line))
    return list(filter(None, (_bare_option_problem(name, commands, alias_ok) for name in names)))


def _bench_options() -> set[str]:
    """The options of the bench scripts (argparse), which pages name beside their commands."""
    found = set()
    for script in (ROOT / "bench").glob("*.py"):
        for call in re.findall(r"add_argument\(([^)]*)", script.read_text(encoding="utf-8")):
            found.update(re.findall(r"[\"'](--?[A-Za-z][\w-]*)[\"']", call))
    return found


EVERY_OPTION = {name for command in COMMANDS.values() for name in _options(command)}
EVERY_OPTION |= {name for param in cli.params for name in param.opts} | _bench_options()


def _bare_option_problem(
    name: str, commands: list[click.Command], alias_ok: bool = False
) -> str | None:
    """Why an inline `--opt` names nothing: no command (or bench script) has it, none of the
    commands named on its line has it, or it is only ever hidden (an old spelling) and its line
    does not say so."""
    if name not in EVERY_OPTION:
        return f"{name} is no option of any command"
    if commands and not any(name in _options(command) for command in commands):
        return f"{name} is not an option of {', '.join(command.name for command in commands)}"
    owners = [command for command in commands or COMMANDS.values() if name in _options(command)]
    if owners and all(_options(command)[name].hidden for command in owners) and not alias_ok:
        names = ", ".join(command.name for command in owners)
        return f"{name} is a hidden option (an old spelling) of {names}"
    return None


def path_problems(span: Span) -> list[str]:
    """A repository path that does not exist (`surgery/engine/writer.py`, `docs/*.png`)."""
    text = re.sub(r":[\w.]+$", "", span.text)  # file.py:123 or file.py:function
    first = text.split("/", 1)[0]
    if text in ROOT_FILES:
        return [] if (ROOT / text).exists() else [f"no file {text}"]
    if not _PATH.match(text) or first not in REPO_DIRS or re.search(r"/[A-Z]+(/|$)", text):
        return []
    return [] if list(ROOT.glob(text.rstrip("/"))) else [f"no file {text}"]


def resolve(name: str) -> bool:
    """Whether a dotted project name (module, module.attr..., or module:attr) exists."""
    module_name, _, attribute = name.removesuffix("()").partition(":")
    parts = module_name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in [*parts[cut:], *filter(None, [attribute])]:
            if not hasattr(target, part):
                return False
            target = getattr(target, part)
        return True
    return False


def name_problems(span: Span) -> list[str]:
    """A backticked `surgery.x.y` (or `eval.x:y`) that does not import."""
    text = span.text
    if not _DOTTED.match(text) or text.rsplit(".", 1)[-1] in _FILE_SUFFIXES:
        return []
    return [] if resolve(text) else [f"{text} does not resolve"]


def python_block_problems(page: Path) -> list[tuple[Where, str, str]]:
    """Imports of the project's packages in a page's Python blocks that do not resolve."""
    found = []
    for language, start, body in fenced_blocks(page):
        if language != "python":
            continue
        for number, name in _imports(body):
            own = name.split(".")[0].split(":")[0] in PACKAGES
            if own and not mentions(name, introduced(page)) and not resolve(name):
                found.append((Where(page, start + number - 1), name, "does not resolve"))
    return found


def _imports(body: list[str]) -> list[tuple[int, str]]:
    """(line, `module` or `module:name`) of each import of a block; a block that is a fragment
    (not valid Python alone) is read one import line at a time."""
    try:
        nodes = list(ast.walk(ast.parse("\n".join(body))))
    except SyntaxError:
        nodes = []
        for number, line in enumerate(body, 1):
            try:
                nodes += [
                    ast.increment_lineno(node, number - 1) for node in ast.parse(line.strip()).body
                ]
            except SyntaxError:
                continue
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.lineno, f"{node.module}:{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _report(found: list[tuple[Where, str, str]]) -> str:
    return "\n".join(f"{where}: `{text}`: {problem}" for where, text, problem in found)


def _example_failures(page: Path) -> list[tuple[Where, str, str]]:
    new = introduced(page)
    found = []
    for example in examples(page):
        if not mentions(example.text, new):
            found += [(example.where, example.text, p) for p in parse_problems(example.args)]
    return found


def _span_failures(page: Path, check) -> list[tuple[Where, str, str]]:
    new = introduced(page)
    return [
        (span.where, span.text, problem)
        for span in page_spans(page)
        if not mentions(span.text, new)
        for problem in check(span)
    ]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_fenced_surgery_example_parses(page):
    failures = _example_failures(page)
    assert not failures, "examples click refuses:\n" + _report(failures)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_inline_commands_and_options_exist(page):
    failures = _span_failures(page, span_problems)
    assert not failures, "inline commands or options that do not exist:\n" + _report(failures)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_named_files_exist(page):
    failures = _span_failures(page, path_problems)
    assert not failures, "files named that do not exist:\n" + _report(failures)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_named_python_names_resolve(page):
    failures = _span_failures(page, name_problems) + python_block_problems(page)
    assert not failures, "Python names that do not resolve:\n" + _report(failures)


def test_the_checks_find_what_does_not_exist(tmp_path):
    """Each check on a page written to fail it: the checks above can fail."""
    page = tmp_path / "_probe_for_the_test.md"
    text = "\n".join(
        [
            "```bash",
            "surgery revert --layers 9:28 base trained out --no-such-option",
            "surgery revert --layers 9:28 base trained",
            "surgery revert --layers 9:28 base trained out extra",
            "surgery no-such-command x",
            "torchrun --nproc-per-node 2 --no-python surgery train base \\",
            "    out --data d/ --no-such-flag",
            "surgery eval m -t copain --dtype bf16",
            "```",
            "Use `surgery revert --no-such-option`, or `--no-such-anywhere`.",
            "Give `soup` its `--layers`.",
            "Score with `surgery eval --dtype bf16`.",
            "See `surgery/engine/no_such_file.py` and `surgery.api.no_such_function`.",
        ]
    )
    page.write_text(text, encoding="utf-8")
    examples_found = _report(_example_failures(page))
    spans_found = _report(_span_failures(page, span_problems))
    files_found = _report(_span_failures(page, path_problems))
    names_found = _report(_span_failures(page, name_problems))
    assert "_probe_for_the_test.md:2: " in examples_found and "--no-such-option" in examples_found
    assert ":3: " in examples_found and "missing OUT" in examples_found
    assert ":4: " in examples_found and "unexpected extra arguments ['extra']" in examples_found
    assert ":5: " in examples_found and "no command 'no-such-command'" in examples_found
    assert ":6: " in examples_found and "--no-such-flag" in examples_found
    assert ":8: " in examples_found and "hidden option --dtype" in examples_found
    assert "--no-such-option is not an option of revert" in spans_found
    assert "--no-such-anywhere is no option of any command" in spans_found
    assert "--layers is not an option of soup" in spans_found
    assert "--dtype is a hidden option (an old spelling) of eval" in spans_found
    assert "no file surgery/engine/no_such_file.py" in files_found
    assert "surgery.api.no_such_function does not resolve" in names_found


def demo_world_blocks() -> dict[tuple[str, int], list[Example]]:
    """The fenced blocks with a command on the demo's world, as (page, block) -> its examples
    other than `surgery demo` itself (built once by the test instead)."""
    blocks: dict[tuple[str, int], list[Example]] = defaultdict(list)
    for page in PAGES:
        for example in examples(page):
            blocks[(_id(page), example.block)].append(example)
    return {
        key: [example for example in found if example.args[:1] != ["demo"]]
        for key, found in blocks.items()
        if any("surgery-demo/" in word for example in found for word in example.args)
    }


@pytest.mark.slow
def test_examples_on_the_demo_world_run(demo, tmp_path, monkeypatch):
    # The session's quick demo (tests/conftest.py), under the name the pages use; the examples
    # only read it and write in the current folder.
    (tmp_path / "surgery-demo").symlink_to(demo, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    blocks = demo_world_blocks()
    assert any(page == "README.md" for page, _ in blocks), "README's quick start is on the demo"
    for found in blocks.values():
        for example in found:
            result = CliRunner().invoke(cli, example.args)
            assert result.exit_code == 0, f"{example.where}: `{example.text}`: {result.output}"
