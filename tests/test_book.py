"""The offline check of the built book finds every asset fetched from another host, and only those."""

from __future__ import annotations

import pytest

from labkit.book import build as book

PAGE = """<!DOCTYPE html><html><head>
<script src="_static/local.js"></script>
<script src="https://cdn.example.org/mathjax/tex-chtml.js"></script>
<link rel="stylesheet" href="//fonts.example.com/css?family=Lato">
<link rel="canonical" href="https://book.example.org/intro.html">
<style>@import "https://cdn.example.org/theme.css"; body { background: url(_static/bg.png) }</style>
</head><body>
<a href="https://arxiv.org/abs/2402.03300">a link to click is not an asset</a>
<img src="_images/figure.png" alt="local">
<img srcset="_images/a.png 1x, http://img.example.org/b.png 2x" alt="mixed">
<div style="background-image: url('https://img.example.org/c.png')"></div>
</body></html>"""

CSS = "@font-face { src: url(https://fonts.example.com/lato.woff2) } .x { background: url(../img/ok.png) }"


def test_external_scripts_styles_fonts_and_images_are_found(tmp_path):
    (tmp_path / "index.html").write_text("<meta http-equiv='refresh' content='0; url=intro.html'>")
    (tmp_path / "intro.html").write_text(PAGE)
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "theme.css").write_text(CSS)
    assert book.find_external_assets(tmp_path) == {
        "intro.html": [
            "//fonts.example.com/css?family=Lato",
            "http://img.example.org/b.png",
            "https://cdn.example.org/mathjax/tex-chtml.js",
            "https://cdn.example.org/theme.css",
            "https://img.example.org/c.png",
        ],
        "_static/theme.css": ["https://fonts.example.com/lato.woff2"],
    }
    assert book.book_pages(tmp_path) == ["index.html", "intro.html"]


def test_a_self_contained_book_passes_and_a_missing_build_is_named(tmp_path):
    (tmp_path / "index.html").write_text('<script src="_static/mathjax/tex-mml-chtml.js"></script>')
    assert book.find_external_assets(tmp_path) == {}
    assert book.main(["check-offline", str(tmp_path)]) == 0
    with pytest.raises(FileNotFoundError, match="has no index.html: build the book first"):
        book.find_external_assets(tmp_path / "nowhere")


# ------------------------------------------------------------------ book/protocol.md

import re  # noqa: E402
from dataclasses import fields  # noqa: E402

from labkit.config import QWEN, TINY  # noqa: E402
from labkit.lab.runs import REPO_ROOT  # noqa: E402

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e-?\d+)?%?")


def _numbers(text: str) -> set[float]:
    """Every number written in a table cell: '4,096' -> 4096, '2e-5' -> 2e-05, '10%' -> 0.1."""
    out = set()
    for token in _NUMBER.findall(text):
        percent = token.endswith("%")
        value = float(token.rstrip("%").replace(",", ""))
        out.add(round(value / 100 if percent else value, 12))
    return out


def _protocol_rows():
    """(quantity, qwen cell, tiny cell, [config fields]) for every table row naming config fields."""
    config_fields = {f.name for f in fields(QWEN)}
    rows = []
    for line in (REPO_ROOT / "book" / "protocol.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("quantity", "---"):
            continue
        named = re.findall(r"`([a-z_]+)`", cells[3])
        if named and all(name in config_fields for name in named):
            rows.append((cells[0], cells[1], cells[2], named))
    return rows


def test_protocol_page_states_every_config_value_of_both_presets():
    rows = _protocol_rows()
    covered = {name for *_, named in rows for name in named}
    differing = {f.name for f in fields(QWEN) if getattr(QWEN, f.name) != getattr(TINY, f.name)}
    assert {"sft_lr", "grpo_lr"} <= covered and len(rows) >= 15
    for quantity, qwen_cell, tiny_cell, named in rows:
        for name in named:
            qwen_value = getattr(QWEN, name)
            assert round(float(qwen_value), 12) in _numbers(qwen_cell), \
                f"protocol.md row {quantity!r}: qwen {name}={qwen_value} not in {qwen_cell!r}"
            if name in differing:
                tiny_value = getattr(TINY, name)
                assert round(float(tiny_value), 12) in _numbers(tiny_cell), \
                    f"protocol.md row {quantity!r}: tiny {name}={tiny_value} not in {tiny_cell!r}"
            else:
                assert tiny_cell == "—", f"protocol.md row {quantity!r}: tiny has the same {name}, write '—'"


def test_protocol_page_states_the_tiny_model_size():
    from labkit.models import presets
    from labkit.models.tokenizer import load_tiny_tokenizer

    text = (REPO_ROOT / "book" / "protocol.md").read_text(encoding="utf-8")
    arch = presets.TINY_ARCH
    count = presets.count_unique_parameters(presets.new_tiny_model())
    shape = (f"{arch['hidden_size']} / {arch['num_hidden_layers']} / {arch['num_attention_heads']} / "
             f"{arch['num_key_value_heads']} / {arch['intermediate_size']:,}")
    vocab = f"{arch['vocab_size']:,} / {len(load_tiny_tokenizer()):,}"
    for row in (f"| 494,032,768 | {count:,} |", f"| 896 / 24 / 14 / 2 / 4,864 | {shape} |",
                f"| 151,936 / 151,665 | {vocab} |"):
        assert row in text, f"book/protocol.md lacks {row!r}: update it from labkit/models/presets.py"


# ------------------------------------------------------------------ book/instructor.md


def test_the_instructor_page_quotes_its_own_smoke_table():
    """The prose's save and reload times are the smoke table's rows (issue 44: 190 s against 199.5 s)."""
    text = (REPO_ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    table = dict(re.findall(r"^\| (state_save|state_reload) \| ([\d.]+) \|", text, re.MULTILINE))
    quoted = re.search(r"took ([\d.]+) s to save and ([\d.]+) s to reload", text)
    assert set(table) == {"state_save", "state_reload"} and quoted
    assert quoted.groups() == (table["state_save"], table["state_reload"])


# ------------------------------------------------------------------ book/glossary.md


def test_the_glossary_names_the_code_as_it_is():
    """Every `config.<field>` and every labkit function the glossary's symbol table names exists (issue 44)."""
    import labkit.eval.evaluate
    import labkit.grpo.losses
    import labkit.task.verifier

    text = (REPO_ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    table = text.split("```{glossary}")[0]
    fields = set(re.findall(r"`config\.([A-Za-z_]+)`", table))
    assert {"G", "clip_eps", "kl_coef", "prompts_per_iteration"} <= fields
    assert all(hasattr(TINY, f) for f in fields), sorted(f for f in fields if not hasattr(TINY, f))
    functions = re.findall(r"`(?:labkit\.(evaluate|verifier)\.)?([a-z_]+)\(", table)
    assert len(functions) >= 5
    for module, name in functions:
        assert hasattr({"evaluate": labkit.eval.evaluate, "verifier": labkit.task.verifier}.get(module, labkit.grpo.losses), name), name


def test_a_streams_chunks_are_stored_merged():
    from labkit.book.build import coalesce_streams

    outs = [{"output_type": "stream", "name": "stdout", "text": "a\n"},
            {"output_type": "stream", "name": "stdout", "text": "b\n"},
            {"output_type": "stream", "name": "stderr", "text": "warn\n"},
            {"output_type": "display_data", "data": {"text/plain": "fig"}, "metadata": {}},
            {"output_type": "stream", "name": "stdout", "text": "c\n"},
            {"output_type": "stream", "name": "stdout", "text": "d"}]
    assert coalesce_streams(outs) == [{"output_type": "stream", "name": "stdout", "text": "a\nb\n"},
                                      {"output_type": "stream", "name": "stderr", "text": "warn\n"},
                                      outs[3], {"output_type": "stream", "name": "stdout", "text": "c\nd"}]
