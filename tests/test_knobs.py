"""Every knob read from the environment: a value it cannot take is one clear error naming the
variable, the value and what it expects, for every knob of hexir/knobs.py."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys

import pytest

from hexir import knobs
from hexir.errors import KnobError

# (field, environment variable, kind of parser) of every knob, read from its default factory.
KNOBS = []
for f in dataclasses.fields(knobs.Knobs):
    source = inspect.getsource(f.default_factory)  # type: ignore[arg-type]
    parser, variable = re.search(
        r"_(env|int|float|flag|choice)\(\s*\"(HEXIR_\w+)\"", source
    ).groups()
    KNOBS.append((f.name, variable, parser))

# A value each parser refuses; free-form strings (paths, commands, flags) take anything.
BAD = {"int": ["abc", "-1", "2.5"], "float": ["abc", "-0.5"], "flag": ["maybe", ""],
       "choice": ["nope"]}  # fmt: skip


def test_every_knob_has_its_own_variable():
    variables = [v for _, v, _ in KNOBS]
    assert len(KNOBS) == len(dataclasses.fields(knobs.Knobs)) == len(set(variables))


@pytest.mark.parametrize(
    "name,variable,value",
    [(n, v, bad) for n, v, p in KNOBS for bad in BAD.get(p, [])],
)
def test_a_bad_value_of_each_knob_is_one_clear_error(monkeypatch, name, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(KnobError) as error:
        knobs.Knobs()
    message = str(error.value)
    assert f"{variable}={value!r}" in message and "\n" not in message
    assert "unset it for the default" in message


SPELLINGS = [("1", True), ("0", False), ("true", True), ("False", False), ("off", False),
             ("YES", True)]  # fmt: skip


@pytest.mark.parametrize("value,expected", SPELLINGS)
def test_flags_read_the_usual_spellings(monkeypatch, value, expected):
    monkeypatch.setenv("HEXIR_FUSION", value)
    assert knobs.Knobs().fusion is expected


def test_the_cli_exits_with_one_line_for_a_bad_flag():
    env = {**os.environ, "HEXIR_SEARCH_TRANSFER": "maybe"}
    done = subprocess.run(
        [sys.executable, "-m", "hexir", "show", "reduce_sum:M=2,N=8"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "HEXIR_SEARCH_TRANSFER='maybe'" in done.stderr
