"""Every Python block of the README runs as written, each in a fresh folder (the tuning block
writes the README's database, tuning_logs/hexir.db, there), and prints what it says it does."""

import re
from pathlib import Path

import pytest

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
# What each block's output shows, by the README section it sits in.
PRINTS = {
    "using-it": "hextir.func @matmul",
    "tuning-from-python": "fused_matmul",  # a task of the mlp is named after its ops
    "schedules-are-data": 'sch.get_block(name="matmul")',
    "symbolic-dimensions-and-text-generation": "SymbolicModule @block",
}


def _section(code: str) -> str:
    before = README[: README.index(code)]
    return re.findall(r"^## (.+)$", before, re.M)[-1].lower().replace(" ", "-")


def test_the_readme_has_each_python_block():
    assert sorted(_section(b) for b in BLOCKS) == sorted(PRINTS)


@pytest.mark.parametrize(
    "code",
    [
        # A block that tunes takes a minute or so on 2 cores.
        pytest.param(b, id=_section(b), marks=[pytest.mark.slow] if "hexir.tune(" in b else [])
        for b in BLOCKS
    ],
)
def test_readme_python_block_runs(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert PRINTS[_section(code)] in capsys.readouterr().out
