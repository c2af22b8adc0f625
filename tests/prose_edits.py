"""Edits an instructor makes that change no behaviour, applied to every module of a copy of labkit.

    python tests/prose_edits.py FOLDER     # FOLDER holds labkit/ (a fresh clone): edits it in place

In every module: a comment line is added, every docstring is reworded, and one bracketed line is
re-wrapped (a line break after an opening bracket).  `edit_module` checks that the module still
compiles and still has the same code once docstrings are set aside; tests/test_fingerprint.py
then asks the cache whether any step went stale (none may).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.lab.fingerprint import strip_docstrings  # noqa: E402


def _docstring_nodes(tree: ast.AST) -> list[ast.Constant]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.append(first.value)
    return out


def reword_docstrings(text: str) -> str:
    """Every docstring with " (reworded)" added to its text."""
    lines = text.splitlines(keepends=True)
    raw = [line.encode("utf-8") for line in lines]
    nodes = sorted(_docstring_nodes(ast.parse(text)), key=lambda n: (n.lineno, n.col_offset), reverse=True)
    for node in nodes:  # from the end, so that earlier positions stay valid
        value = node.value.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + " (reworded)"
        literal = f'"""{value}"""'.encode("utf-8")
        start, end = node.lineno - 1, node.end_lineno - 1
        head = raw[start][: node.col_offset]
        tail = raw[end][node.end_col_offset:]
        raw[start: end + 1] = [head + literal + tail]
    return b"".join(raw).decode("utf-8")


def rewrap_one_line(text: str) -> str:
    """A line break after the first opening bracket whose line goes on after it (inside brackets a
    break changes nothing)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for tok, nxt in zip(tokens, tokens[1:]):
        if tok.type == tokenize.OP and tok.string in "([{" and nxt.start[0] == tok.end[0] \
                and nxt.string not in ")]}" and nxt.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            lines = text.splitlines(keepends=True)
            row, col = tok.end[0] - 1, tok.end[1]
            line = lines[row]
            indent = len(line) - len(line.lstrip())
            lines[row] = line[:col] + "\n" + " " * (indent + 8) + line[col:].lstrip()
            return "".join(lines)
    return text


def add_comment(text: str) -> str:
    return text + ("" if text.endswith("\n") else "\n") + "# A note an instructor added for the next reader.\n"


def edit_module(text: str) -> str:
    """`text` with the three edits; refuses (AssertionError) if they changed its code."""
    edited = add_comment(rewrap_one_line(reword_docstrings(text)))
    before = ast.dump(strip_docstrings(ast.parse(text)))
    after = ast.dump(strip_docstrings(ast.parse(edited)))
    assert before == after, "a prose edit changed the code"
    return edited


def edit_package(root: Path) -> list[Path]:
    """Edit every module under root/labkit in place; returns the modules edited."""
    edited = []
    for path in sorted((Path(root) / "labkit").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        new = edit_module(text)
        assert new != text, path
        path.write_text(new, encoding="utf-8")
        edited.append(path)
    return edited


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/prose_edits.py FOLDER   (the folder that holds labkit/)")
    done = edit_package(Path(sys.argv[1]))
    print(f"{len(done)} modules edited: a comment, their docstrings reworded, one line re-wrapped")
