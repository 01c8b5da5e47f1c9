"""The suite's own scheduling: under `-n 2 --dist loadgroup` the tests that share a session fixture (a whole pipeline
run) run on one worker, so it is built once (pytest 9.2 with xdist 3.8 silently grouped nothing: every shared
pipeline and server stack was built on both workers)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = '''

@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    import os
    (BUILDS / os.environ["PYTEST_XDIST_WORKER"]).mkdir(parents=True, exist_ok=True)
    return 1
'''


def test_a_session_fixture_is_built_once_under_xdist(tmp_path):
    tests, builds = tmp_path / "tests", tmp_path / "builds"
    tests.mkdir()
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    (tests / "conftest.py").write_text(conftest + f"\nBUILDS = Path({str(builds)!r})\n" + FIXTURE)
    shutil.copy(ROOT / "tests" / "helpers.py", tests / "helpers.py")
    for module in "ab":
        body = "".join(f"def test_{module}{i}(shared):\n    pass\n\n\ndef test_{module}_alone{i}():\n    pass\n\n\n"
                       for i in range(4))
        (tests / f"test_{module}.py").write_text(body)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "tests"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(list(builds.iterdir())) == 1, [p.name for p in builds.iterdir()]
