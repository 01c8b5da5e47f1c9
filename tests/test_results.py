"""The results log (`distillery.results`) and the demo check's comparisons (`benchmarks.demo`): a figure in the README
comes from a run, and two runs agree or the check says where not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.demo import (close, compare_lines, readme_line, speed_problems, split_line, timing_counts,
                             with_readme_line)
from distillery.results import append_run, read_log, render

ROOT = Path(__file__).resolve().parents[1]

SUMMARY = {"demo": {"teacher": {"accuracy": 0.985, "speedup_b1": 1.0, "speedup_p10_b1": 1.0, "speedup_p90_b1": 1.0},
                    "s": {"accuracy": 0.9, "retention": 0.914, "gain_over_direct": 0.1, "speedup_b1": 2.6,
                          "speedup_p10_b1": 2.5, "speedup_p90_b1": 2.7},
                    "s-direct": {"accuracy": 0.8, "baseline_of": "s"}}}


def test_a_run_becomes_a_row_of_the_log_and_the_page_is_rendered_from_the_rows(tmp_path):
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "summary.json").write_text(json.dumps(SUMMARY))
    md = tmp_path / "results.md"
    row = append_run(md, run, command="python -m flows.pipeline", seconds=412.3)
    append_run(md, run, command="python -m flows.pipeline", seconds=400.0)
    rows = read_log(tmp_path / "results.jsonl")
    assert len(rows) == 2 and rows[0] == row and row["tasks"]["demo"]["s"]["speedup_p10_b1"] == 2.5
    text = md.read_text()
    assert text == render(rows)
    assert "| s | 90.00 | 0.914 | +10.00 | 2.6x [2.5-2.7] |" in text and "412 s" in text and "cores" in text
    assert row["machine"].endswith("bf16")  # its fast-bf16 instruction sets, or "no fast bf16": what `auto` trains in
    (run / "models" / "search" / "s").mkdir(parents=True)  # a budgeted student's search, beside evaluate's figure
    (run / "models" / "search" / "s" / "search.json").write_text(json.dumps(
        {"winner": {"name": "3x288-int8", "form": "int8", "speedup": 6.8, "speedup_p10": 6.05, "ms": 4.4}}))
    from distillery.results import main

    assert main([str(run), "--command", "python -m flows.pipeline --preset budget", "--seconds", "1900",
                 "--log", str(md)]) == 0
    newest = read_log(tmp_path / "results.jsonl")[-1]
    assert newest["search"] == {"s": {"name": "3x288-int8", "form": "int8", "speedup": 6.8, "speedup_p10": 6.05}}
    assert newest["command"] == "python -m flows.pipeline --preset budget" and md.read_text() == render(read_log(
        tmp_path / "results.jsonl"))
    assert main([str(run), "--command", "c", "--seconds", "1", "--log", str(md), "--commit", "0123abc"]) == 0
    assert read_log(tmp_path / "results.jsonl")[-1]["commit"] == "0123abc"  # a checkout that moved on after its run


def test_a_benchmarks_console_output_becomes_a_row(tmp_path, capsys):
    from distillery.results import main

    out = tmp_path / "precision.txt"
    out.write_text("torch 2.13.0+cpu, 2 threads\n\n(a) distillation step: fp32 2041 ms, bf16 777 ms, 2.63x\n"
                   "train_speedup: 2.63 kernels_gain: 1.18\n")
    md = tmp_path / "results.md"
    assert main(["--output", str(out), "--command", "python -m benchmarks.precision", "--seconds", "106",
                 "--log", str(md)]) == 0
    row = read_log(tmp_path / "results.jsonl")[-1]
    assert row["output"][-1] == "train_speedup: 2.63 kernels_gain: 1.18" and len(row["output"]) == 3
    assert "```text\ntorch 2.13.0+cpu, 2 threads\n(a) distillation step" in md.read_text()
    with pytest.raises(SystemExit, match="2"):  # neither a run nor an output: the usage line
        main(["--command", "x", "--seconds", "1", "--log", str(md)])
    assert main(["--output", str(tmp_path / "none.txt"), "--command", "x", "--seconds", "1", "--log", str(md)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_docs_results_page_is_the_rendering_of_its_log():
    log = ROOT / "docs" / "results.jsonl"
    if log.is_file():
        assert (ROOT / "docs" / "results.md").read_text(encoding="utf-8") == render(read_log(log))


def test_two_lines_agree_on_everything_but_speedups_within_ten_percent():
    line = ("demo: best student s 0.9000 = 0.91 of the teacher's 0.9850, 2.6x [2.5-2.7] faster at batch 1 "
            "(4.1x [3.9-4.3] in int8), +10.0 points over the same student without distillation; "
            "5 of 5 students beat their direct baseline")
    assert split_line(line)[1] == [2.6, 4.1]
    assert compare_lines(line, line.replace("2.6x [2.5-2.7]", "2.8x [2.6-2.9]"), "x") == []
    assert len(compare_lines(line, line.replace("2.6x [2.5-2.7]", "3.1x [3.0-3.2]"), "x")) == 1
    assert len(compare_lines(line, line.replace("5 of 5", "4 of 5"), "x")) == 1
    assert len(compare_lines(line, line.replace("4.1x [3.9-4.3]", "unresolved [1.2-8.0x over the rounds]"), "x")) == 1
    assert close(None, None) and not close(None, 2.0)
    text = "intro <!-- demo-line -->`old`<!-- /demo-line --> outro"
    assert readme_line(with_readme_line(text, line)) == line


def test_two_timings_of_the_same_models_are_compared_speedup_by_speedup():
    """`--retime`'s comparison: each speedup against the first timing's, agreeing (within 10%, or unresolved in both),
    within 10% but resolved in one timing only, or further apart."""
    def timing(**speeds):
        return {"demo": {"s": {f"speedup_{k}": v[0] for k, v in speeds.items()}
                         | {f"speedup_{q}_{k}": v[i] for k, v in speeds.items() for i, q in ((1, "p10"), (2, "p90"))}}}

    first = timing(b1=(2.6, 2.5, 2.7), b1_int8=(7.0, 6.5, 7.5), b32=(4.0, 3.9, 4.1))
    same = timing(b1=(2.7, 2.6, 2.8), b1_int8=(7.2, 6.8, 7.6), b32=(4.1, 4.0, 4.2))
    assert speed_problems(first, same, "timing 2") == []
    other = timing(b1=(2.7, 2.6, 2.8), b1_int8=(7.2, 5.0, 9.0), b32=(5.0, 4.9, 5.1))  # int8 unresolved, b32 25% off
    problems = speed_problems(first, other, "timing 2")
    assert [p.split(" (")[0] for p in problems] == ["timing 2: demo: s.speedup_b1_int8 7.2 against 7.0",
                                                    "timing 2: demo: s.speedup_b32 5.0 against 4.0"]
    assert timing_counts([first, same, other]) == (
        "6 speedups against the first timing's: 4 agree, 1 within 10% but unresolved in one timing only, "
        "1 further apart; the largest ratio of two medians 1.25x")


def test_the_readme_table_is_the_newest_measured_demo_run_of_the_log():
    from benchmarks.demo import TABLE_MARKERS
    from distillery.results import readme_table

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = (readme.find(m) for m in TABLE_MARKERS)
    assert 0 <= start < end
    table = readme_table(read_log(ROOT / "docs" / "results.jsonl"))
    assert readme[start + len(TABLE_MARKERS[0]):end].strip() == table.strip()


def test_the_readme_table_shows_each_student_beside_its_direct_baseline_and_skips_transcribed_runs():
    from distillery.results import readme_table

    newer = {"date": "2026-12-02", "commit": "x", "machine": "m", "command": "c", "wall_s": None,
             "transcribed": "docs/presets.md", "tasks": {"demo": {"t": {"accuracy": 0.5}}}}
    rows = [{"date": "2026-12-01", "commit": "abc", "machine": "m", "command": "c", "wall_s": 1.0,
             "tasks": {"demo": {**SUMMARY["demo"], "s-int8": {"speedup_b1": 6.0, "speedup_p10_b1": 5.9,
                                                              "speedup_p90_b1": 6.1}}}}, newer]
    table = readme_table(rows)
    assert "| s | 90.00 | 0.914 | 80.00 | 2.6x [2.5-2.7] | - | 6.0x [5.9-6.1] |" in table
    assert "abc" in table and "| t |" not in table and "| s-direct |" not in table
    assert "Transcribed from docs/presets.md" in render(rows)
