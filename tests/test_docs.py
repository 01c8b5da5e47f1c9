"""The docs: the MkDocs site builds with --strict (no broken link or anchor), and the README stays a short
introduction whose relative links all point to files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAPERS = ("TinyBERT", "MiniLM", "MobileBERT", "DistilBERT", "BERT-PKD")


def test_mkdocs_build_strict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_is_short_and_names_the_papers():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    missing = [paper for paper in PAPERS if paper not in text]
    assert not missing, f"README.md does not name {missing}"


def _relative_links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)       # code blocks hold no links
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_relative_links_point_to_files():
    links = _relative_links(README.read_text(encoding="utf-8"))
    assert links, "README.md has no relative links"
    broken = [link for link in links if not (ROOT / link.split("#", 1)[0]).exists()]
    assert not broken, f"README.md links to missing files: {broken}"
