"""The README's Python example runs as written."""

import re
from pathlib import Path


def test_readme_python_example_runs(capsys):
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README has no Python example"
    for code in blocks:
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)
    assert "hextir.func @matmul" in capsys.readouterr().out
