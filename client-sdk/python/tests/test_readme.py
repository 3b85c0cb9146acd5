"""The README's Python examples run, as written, against the dev cluster."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from conftest import DevCluster

README = Path(__file__).resolve().parent.parent / "README.md"


def examples() -> List[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_examples() -> None:
    assert len(examples()) >= 2


@pytest.mark.parametrize("index", range(len(examples())))
def test_readme_example_runs(
    cluster: DevCluster, index: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    script = tmp_path / f"example_{index}.py"
    script.write_text(examples()[index])
    env = cluster.env()
    if "DATABASE_URL" in examples()[index]:  # the fenced-transaction example
        pg = request.getfixturevalue("pg")
        request.getfixturevalue("pgdsn")  # the database, schema installed
        env["DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:{pg.port}/fencing"
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if index == 0:
        assert "wrote with token" in done.stdout and "b'hello'" in done.stdout
    if index == 1:
        assert "leading with token" in done.stdout
        assert "stopped leading: shutting down" in done.stdout
    if "DATABASE_URL" in examples()[index]:
        assert "committed with token" in done.stdout
    if "iter_objects" in examples()[index]:  # the store example
        assert "listed inventory/widgets version" in done.stdout
