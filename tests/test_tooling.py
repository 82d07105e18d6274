"""The public API is curated, typed, and the linters are clean."""

from __future__ import annotations

import ast
import io
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import resgroups

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_is_exported_exactly_once() -> None:
    assert len(resgroups.__all__) == len(set(resgroups.__all__))
    for name in resgroups.__all__:
        assert hasattr(resgroups, name), name
    errors = [
        obj
        for name, obj in vars(resgroups.errors).items()
        if isinstance(obj, type) and issubclass(obj, resgroups.Error)
    ]
    for cls in errors:
        assert cls.__name__ in resgroups.__all__, cls


def test_error_sqlstates() -> None:
    expected = {
        "SqlSyntaxError": "42601",
        "InvalidParameter": "22023",
        "CatalogError": "42704",
        "PermissionDenied": "42501",
        "AuthenticationFailed": "28P01",
        "FeatureNotSupported": "0A000",
        "ReadOnlyReplica": "25006",
        "CatalogLocked": "55006",
        "CatalogLagError": "55000",
        "AdmissionRejected": "53400",
        "QueueTimeout": "57014",
        "QueryTimeout": "57014",
        "QueryCancelled": "57014",
        "RunawayQuery": "57014",
        "MemoryLimitExceeded": "53200",
        "CoordinationUnavailable": "08006",
        "NumericOverflow": "22003",
        "InternalError": "XX000",
    }
    for name, state in expected.items():
        assert getattr(resgroups, name).sqlstate == state, name


def test_package_is_typed() -> None:
    assert (ROOT / "resgroups" / "py.typed").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
        ["lint-imports"],  # the layering contract of docs/architecture.md
    ],
)
def test_linters_are_clean(command: list[str]) -> None:
    tool = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert tool is not None, f"{command[0]} is part of the test extra"
    result = subprocess.run([tool, *command[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


MAX_CODE_LINES = 600  # a module larger than this holds more than one concept


def code_lines(source: str) -> int:
    """Lines of ``source`` that hold code: its docstrings (a module's, a class's, a
    function's), comments and blank lines aside."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped and token.type != tokenize.ENDMARKER:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_count_code_only() -> None:
    source = '''"""A module's memo,
over two lines."""

# a comment


class A:
    """A class's docstring."""

    def f(self) -> str:
        """A function's."""
        text = """a string that is
not a docstring"""
        return text  # a trailing comment
'''
    assert code_lines(source) == 5  # class, def, the string's two lines, return


def test_no_module_is_over_600_lines_of_code() -> None:
    """A module names one concept (docs/architecture.md): past 600 lines of code,
    its memo and docstrings aside, something in it belongs in a module of its own."""
    sizes = {
        str(path.relative_to(ROOT)): code_lines(path.read_text())
        for path in sorted((ROOT / "resgroups").rglob("*.py"))
    }
    assert len(sizes) > 100
    over = {path: n for path, n in sizes.items() if n > MAX_CODE_LINES}
    assert not over, f"over {MAX_CODE_LINES} lines of code: {over}"


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def test_the_readme_commands_make_their_own_virtual_environment() -> None:
    """Each works in a fresh shell where the system's Python refuses pip (PEP 668)."""
    install_and_demo, install_and_test = _readme_commands()
    for command in (install_and_demo, install_and_test):
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install")
    assert install_and_demo.endswith("&& resgroups demo")
    assert install_and_test.endswith('pip install -e ".[test]" && pytest')


def test_ci_runs_the_readme_test_command_as_written() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    extract = next(line for line in script.splitlines() if line.startswith("test_command="))
    found = subprocess.run(
        ["bash", "-c", f'{extract}\nprintf "%s" "$test_command"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found == _readme_commands()[1]
    assert 'bash -c "$test_command"' in script
