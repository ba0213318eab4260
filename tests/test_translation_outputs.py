"""FLORES output diagnostics: why generations stopped, empty outputs and length quantiles, by
hand from the logged samples; our first-line cut against the reference's post-processing, on
strings and on a tiny model's real generations; the `postprocess: reference` option."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eval.api import evaluate
from eval.generation import (
    POSTPROCESS,
    STOPS,
    _greedy_config,
    first_line,
    generate,
    has_line_break,
    reference_line,
)
from eval.kinds.translation_outputs import DIAGNOSTICS, QUANTILES, STOP_RATES, output_diagnostics
from surgery.diagnostics.metric_kinds import OUTPUT_RATES
from surgery.diagnostics.results import metric_names
from tests.support.tiny_models import build_model, make_tokenizer


def reference_rule(generation: str) -> str:
    """The reference's rule as its scripts/flores_postprocess.py states it (truncate_translation):
    strip leading whitespace, cut at the first literal backslash-n or newline, strip."""
    if not generation:
        return generation
    generation = generation.lstrip()
    cuts = [i for i in (generation.find("\\n"), generation.find("\n")) if i >= 0]
    if cuts:
        generation = generation[: min(cuts)]
    return generation.strip()


def reference_truncated(response: str) -> bool:
    """The reference's first_line_truncation_rate counts a response when this holds
    (scripts/flores_layer_localization.py, _output_diagnostics)."""
    return "\\n" in response.lstrip() or "\n" in response.lstrip()


def reference_quantile(values: list[int], quantile: float) -> int:
    """The reference's `_quantile` (flores_layer_localization.py)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[round((len(ordered) - 1) * quantile)]


TEXT = st.text(alphabet=[" ", "\t", "\n", "\\", "n", "a", "é", "."], max_size=12)


@given(TEXT)
def test_reference_line_is_the_reference_rule(text):
    assert reference_line(text) == reference_rule(text)
    assert has_line_break(text) == reference_truncated(text)


@given(TEXT)
def test_first_line_is_the_reference_rule_unless_a_leading_newline_or_backslash_n(text):
    leading = text[: len(text) - len(text.lstrip())]
    if "\n" not in leading and "\\n" not in first_line(text):
        assert first_line(text) == reference_rule(text)


@pytest.mark.parametrize(
    ("text", "ours", "reference"),
    [
        (" Halo dunia.\nEnglish sentence:", "Halo dunia.", "Halo dunia."),
        ("\nHalo dunia.\n", "", "Halo dunia."),  # a leading newline: our line is empty
        ("  \n Halo.", "", "Halo."),
        ("Halo\\ndunia.", "Halo\\ndunia.", "Halo"),  # a literal backslash-n
        ("", "", ""),
    ],
)
def test_where_the_cuts_differ(text, ours, reference):
    assert first_line(text) == ours and reference_line(text) == reference == reference_rule(text)


@given(st.lists(st.integers(0, 500), max_size=60), st.sampled_from(QUANTILES))
def test_length_quantiles_are_the_references(lengths, percent):
    diagnostics = output_diagnostics(["x" * n for n in lengths], [None] * len(lengths))
    assert diagnostics[f"length_p{percent}"] == reference_quantile(lengths, percent / 100)


def test_diagnostics_are_rates_and_lengths():
    lines = ["abc", "", "de", "", "fghij"]
    stops = ["newline", "newline", "eos", "limit", "newline"]
    got = output_diagnostics(lines, stops)
    assert got == {
        "truncation_rate": 3 / 5,
        "eos_rate": 1 / 5,
        "limit_rate": 1 / 5,
        "empty_rate": 2 / 5,
        "length_p50": 2,  # sorted 0 0 2 3 5, index round(4 * 0.5) = 2
        "length_p90": 5,  # index round(3.6) = 4
        "length_p95": 5,
        "length_p99": 5,
    }
    assert list(got) == list(DIAGNOSTICS)
    unlogged = output_diagnostics(lines, [None] * 5)
    assert unlogged["truncation_rate"] is None and unlogged["empty_rate"] == 2 / 5


def test_output_rates_are_never_scored_by_sweep_or_localize():
    # surgery cannot import eval: its table must name the same rates.
    assert {*STOP_RATES.values(), "empty_rate"} == OUTPUT_RATES
    row = {"alpha": 0.0, "flores/chrf": 40.0, "flores/n": 5, "flores/truncation_rate": 0.2}
    row |= {"flores/empty_rate": 0.0, "flores/length_p50": 12}
    assert metric_names([row]) == ["flores/chrf"]


# A bigram script: each token's successor. A prompt ends in a digit that starts one line of
# the table below; "eos" is the model's end-of-sequence token.
SCRIPT = {
    "\n": "H", "H": "a", "a": "l", "l": "o", "o": "\n",  # after a newline: Halo, again
    "1": "\n",  # a leading newline
    "7": " ", " ": "\n",  # leading whitespace, then a newline
    "3": "d", "d": "u", "u": "\\", "\\": "n", "n": "k", "k": "e", "e": "eos",  # du\\nke
    "8": "\\",  # \\nke: a literal backslash-n first
    "4": "b", "b": "e",  # be, then EOS
    "5": "x", "x": "y", "y": "x",  # xyxy... to the token limit
    "6": "t", "t": "\n",  # one word, then a newline
}  # fmt: skip
# prompt's last digit -> (our line, our stop, the reference's line, its stop), 12 tokens at most
EXPECTED = {
    "1": ("", "newline", "Halo", "newline"),
    "7": ("", "newline", "Halo", "newline"),
    "3": ("du\\nke", "eos", "du", "newline"),
    "8": ("\\nke", "eos", "", "newline"),
    "4": ("be", "eos", "be", "eos"),
    "5": ("xyxyxyxyxyxy", "limit", "xyxyxyxyxyxy", "limit"),
    "6": ("t", "newline", "t", "newline"),
}


@pytest.fixture(scope="module")
def scripted():
    """A real tiny Llama whose greedy continuation follows `SCRIPT`: its layers add nothing to
    the residual stream (output projections zero), each scripted token's embedding is its own
    direction, and the head maps that direction to the token's successor."""
    tokenizer = make_tokenizer()
    model = build_model("llama").float().eval()

    def token(text: str) -> int:
        if text == "eos":
            return tokenizer.eos_token_id
        (found,) = tokenizer.encode(text, add_special_tokens=False)
        return found

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.zero_()
        head.zero_()
        for direction, (source, successor) in enumerate(SCRIPT.items()):
            embed[token(source), direction] = 1.0
            head[token(successor), direction] = 10.0
    return model, tokenizer


def raw_generations(model, tokenizer, prompts, max_new_tokens):
    """Each prompt's greedy continuation run to EOS or the token limit, never stopped at a
    line end, one prompt at a time: what the reference generates (`until: []`)."""
    config = _greedy_config(model, tokenizer, max_new_tokens)
    texts = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt)])
        out = model.generate(input_ids=ids, generation_config=config)[0, ids.shape[1] :]
        texts.append(tokenizer.decode(out, skip_special_tokens=True))
    return texts


@pytest.mark.parametrize("postprocess", POSTPROCESS)
def test_generations_cut_as_a_run_to_the_limit_then_cut(scripted, postprocess):
    """Stopping where the line ends gives the line that generating on and cutting afterwards
    gives, and a generation stops at a line end exactly when that cut removes something."""
    model, tokenizer = scripted
    prompts = [f"English sentence: x\nIndonesian sentence: {digit}" for digit in EXPECTED]
    raw = raw_generations(model, tokenizer, prompts, 12)
    ours = generate(
        model, tokenizer, prompts, max_new_tokens=12, max_length=128, batch_size=2,
        postprocess=postprocess,
    )  # fmt: skip
    cut = first_line if postprocess == "first_line" else reference_rule
    ends = (lambda text: "\n" in text) if postprocess == "first_line" else reference_truncated
    for digit, full, generation in zip(EXPECTED, raw, ours, strict=True):
        assert full.startswith(generation.text)
        assert generation.line == cut(full)
        assert (generation.stop == "newline") == ends(full)
        line, stop = EXPECTED[digit][:2] if postprocess == "first_line" else EXPECTED[digit][2:]
        assert (generation.line, generation.stop) == (line, stop), digit
    assert set(STOPS) == {generation.stop for generation in ours}


@pytest.fixture(scope="module")
def chatty():
    """A tiny random Llama whose head's newline row is scaled up: some outputs end their line,
    others run to the token limit."""
    tokenizer = make_tokenizer()
    model = build_model("llama").float().eval()
    with torch.no_grad():
        (newline,) = tokenizer.encode("\n", add_special_tokens=False)
        model.lm_head.weight[newline] *= 6.0
    return model, tokenizer


def write_flores(folder, count=16):
    """A FLORES folder of `count` aligned sentences in English and Indonesian."""
    words = ["kucing", "anjing", "taman", "tikar", "halo", "dunia", "merah", "bola"]
    (folder / "devtest").mkdir(parents=True)
    lines = {
        "eng_Latn": [f"The sentence {i} is about {words[i % 8]}." for i in range(count)],
        "ind_Latn": [f"Kalimat {i} tentang {words[(3 * i) % 8]}." for i in range(count)],
    }
    for lang, sentences in lines.items():
        (folder / "devtest" / f"{lang}.devtest").write_text("\n".join(sentences) + "\n")
    return folder


@pytest.mark.parametrize("postprocess", POSTPROCESS)
def test_eval_records_the_diagnostics_of_its_logged_outputs(chatty, tmp_path, postprocess):
    model, tokenizer = chatty
    flores = write_flores(tmp_path / "flores")
    task = f"flores:{flores}:src=eng_Latn,tgt=ind_Latn,shots=1,max_new_tokens=8"
    task += f",postprocess={postprocess}"
    log = tmp_path / "samples.jsonl"
    result = evaluate(model, tokenizer, [task], progress=False, log_samples=log, batch_size=4)
    metrics = result["metrics"]
    assert result["config"]["tasks"]["flores"]["postprocess"] == postprocess
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == metrics["flores/n"] == 16
    outputs = [r["hypothesis"] for r in records]
    stops = [r["stop"] for r in records]
    n = len(records)
    # By hand, from the logged outputs.
    assert metrics["flores/truncation_rate"] == sum(s == "newline" for s in stops) / n
    assert metrics["flores/eos_rate"] == sum(s == "eos" for s in stops) / n
    assert metrics["flores/limit_rate"] == sum(s == "limit" for s in stops) / n
    assert math.isclose(
        metrics["flores/truncation_rate"] + metrics["flores/eos_rate"]
        + metrics["flores/limit_rate"], 1.0
    )  # fmt: skip
    assert metrics["flores/empty_rate"] == sum(o == "" for o in outputs) / n
    for q in QUANTILES:
        lengths = sorted(len(o) for o in outputs)
        assert metrics[f"flores/length_p{q}"] == lengths[round((n - 1) * q / 100)]
    cut = first_line if postprocess == "first_line" else reference_line
    for record in records:
        assert cut(record["raw_generation"]) == record["hypothesis"] == record["generation"]
    assert 0 < metrics["flores/truncation_rate"] < 1  # the measure is not vacuous
