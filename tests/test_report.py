"""The TinyBERT-Table-1-style report: table rows, retention, speedup, plots."""

import struct

import pytest

from distillery.report import (AVERAGE, ReportError, averages, build_rows, read_loss_curve, render_markdown, retention,
                               rows_lines, write_report)

SUMMARY = {
    "sst2": {"teacher": {"params": 109_000_000, "flops": 22.3e9, "accuracy": 0.92},
             "tiny4": {"params": 14_500_000, "flops": 1.2e9, "accuracy": 0.88, "retention": 0.956}},
    "mrpc": {"teacher": {"params": 109_000_000, "accuracy": 0.84, "f1": 0.88},
             "tiny4": {"params": 14_500_000, "accuracy": 0.78, "f1": 0.84, "retention": 0.94}},
    "stsb": {"teacher": {"pearson": 0.88, "spearman": 0.86},
             "tiny4": {"pearson": 0.80, "spearman": 0.78, "retention": 0.9}},
}


def test_rows_scores_average_retention_speedup():
    tasks, rows = build_rows(SUMMARY, latency={"teacher": 100.0, "tiny4": {"median_ms": 10.0}})
    assert tasks == ["sst2", "mrpc", "stsb"]
    teacher, tiny = rows
    assert teacher["is_teacher"] and not tiny["is_teacher"]
    assert tiny["scores"]["mrpc"] == pytest.approx((0.78 + 0.84) / 2)  # GLUE: mean of acc and F1
    assert tiny["scores"]["stsb"] == pytest.approx(0.79)
    assert tiny["avg"] == pytest.approx((0.88 + 0.81 + 0.79) / 3)
    assert tiny["retention"] == pytest.approx(tiny["avg"] / teacher["avg"])
    assert tiny["speedup"] == pytest.approx(10.0) and teacher["speedup"] == pytest.approx(1.0)
    assert teacher["retention"] is None


def test_averages_retention_of_the_average_and_mean_of_retentions():
    main = {"sst2": {"teacher": 0.864, "s": 0.852, "only_sst2": 0.5}, "cola": {"teacher": 0.278, "s": 0.235}}
    avg = averages(main, "teacher")
    assert set(avg) == {"teacher", "s"}  # only models scored on every task
    assert avg["s"]["main"] == pytest.approx((0.852 + 0.235) / 2)
    assert avg["s"]["retention"] == pytest.approx((0.852 + 0.235) / (0.864 + 0.278))  # the papers' "96.8%"
    assert avg["s"]["mean_task_retention"] == pytest.approx((0.852 / 0.864 + 0.235 / 0.278) / 2)
    assert "retention" not in avg["teacher"]
    # the averages sit beside the tasks in the summary, and the report does not take them for a task
    tasks, _ = build_rows({**SUMMARY, AVERAGE: {"teacher": {"main": 0.8}, "tiny4": {"main": 0.7, "retention": 0.9}}})
    assert tasks == ["sst2", "mrpc", "stsb"]


def test_no_retention_of_a_teacher_that_scores_zero_or_below():
    # CoLA's MCC (or a correlation) at 0 passes a gate of min_gain_over_trivial 0 against the trivial baseline's 0:
    # a ratio to it means nothing, and none is given (it was a ZeroDivisionError in the report stage)
    assert retention(0.3, 0.6) == pytest.approx(0.5)
    assert retention(0.3, 0.0) is None and retention(0.3, -0.1) is None
    for teacher_cola in (0.0, -0.05):
        avg = averages({"sst2": {"teacher": 0.8, "s": 0.7}, "cola": {"teacher": teacher_cola, "s": 0.1}}, "teacher")
        assert avg["s"]["main"] == pytest.approx(0.4) and "retention" not in avg["s"]
    _, rows = build_rows({"cola": {"teacher": {"mcc": 0.0}, "s": {"mcc": 0.1}}})
    assert [r["retention"] for r in rows] == [None, None]


def test_glue_and_squad_average_like_with_like():
    # SQuAD's F1 is in percent in the summary (the official script's scale), GLUE's scores are fractions: the table's
    # average takes F1 / 100, as the summary's own average does (task_kinds' main score)
    summary = {"sst2": {"teacher": {"accuracy": 0.9}, "s": {"accuracy": 0.88, "retention": 0.98}},
               "squad": {"teacher": {"exact_match": 59.2, "f1": 71.8}, "s": {"exact_match": 56.0, "f1": 68.8,
                                                                            "retention": 0.96}}}
    tasks, rows = build_rows(summary)
    teacher, student = rows
    assert teacher["scores"]["squad"] == pytest.approx(0.718) and teacher["avg"] == pytest.approx((0.9 + 0.718) / 2)
    assert student["retention"] == pytest.approx((0.88 + 0.688) / (0.9 + 0.718))
    assert "| 90.0 | 71.8 | 80.9 |" in render_markdown(tasks, rows)


def test_markdown_layout_like_table1():
    tasks, rows = build_rows(SUMMARY, latency={"teacher": 100.0, "tiny4": 10.0})
    md = render_markdown(tasks, rows)
    lines = [line for line in md.splitlines() if line.startswith("|")]
    assert lines[0] == "| System | #Params | #FLOPs | Speedup | SST2 | MRPC | STSB | Avg | Retention |"
    assert lines[2].startswith("| teacher (teacher) | 109.0M | 22.3B | 1.0x | 92.0 | 86.0 | 87.0 |")
    assert lines[3].startswith("| tiny4 | 14.5M | 1.2B | 10.0x | 88.0 | 81.0 | 79.0 | 82.7 |")
    assert lines[3].endswith(f"| {100 * (0.88 + 0.81 + 0.79) / (0.92 + 0.86 + 0.87):.1f}% |")
    assert "-int8" not in md


def test_int8_rows_are_explained():
    summary = {"sst2": {**SUMMARY["sst2"], "tiny4-int8": {"params": 14_500_000, "accuracy": 0.87, "retention": 0.95}}}
    tasks, rows = build_rows(summary, latency={"teacher": 100.0, "tiny4": 10.0, "tiny4-int8": 5.0})
    assert [r["model"] for r in rows] == ["teacher", "tiny4", "tiny4-int8"]
    assert rows[2]["speedup"] == pytest.approx(20.0)
    assert "Rows ending in -int8" in render_markdown(tasks, rows)


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_write_report_files_and_plots(tmp_path):
    log_a = tmp_path / "a.csv"
    log_a.write_text("step,loss,learning_rate\n1,2.5,0.1\n2,,0.1\n3,1.5,0.1\n")
    log_b = tmp_path / "b.csv"
    log_b.write_text("step,loss\n1,3.0\n2,2.0\n")
    out = tmp_path / "reports"
    paths = write_report(SUMMARY, out, latency={"teacher": 100.0, "tiny4": 10.0},
                         loss_curves={"tiny4 task": log_a, "tiny4 general": log_b})
    names = sorted(p.name for p in paths)
    assert names == ["loss_curves.png", "score_vs_latency.png", "score_vs_size.png", "table.html", "table.md"]
    for p in paths:
        assert p.is_file() and p.parent == out
        if p.suffix == ".png":
            w, h = _png_size(p)
            assert w > 200 and h > 150
    html = (out / "table.html").read_text()
    assert "<th>#FLOPs</th>" in html and "score_vs_size.png" in html and "<td>10.0x</td>" in html
    assert not list(out.glob(".*tmp"))  # atomic writes leave no temporaries
    assert read_loss_curve(log_a) == ([1.0, 3.0], [2.5, 1.5])


def test_without_latency_the_latency_plot_is_skipped(tmp_path):
    paths = write_report(SUMMARY, tmp_path)
    assert sorted(p.name for p in paths) == ["score_vs_size.png", "table.html", "table.md"]
    assert "| - |" in (tmp_path / "table.md").read_text()  # no speedup without latencies


def test_bad_inputs(tmp_path):
    with pytest.raises(ReportError):
        build_rows({})
    with pytest.raises(ReportError, match="sst2"):
        build_rows({"sst2": {"m": 0.9}})
    with pytest.raises(ReportError, match="nobody"):
        build_rows(SUMMARY, teacher="nobody")
    bad = tmp_path / "bad.csv"
    bad.write_text("step,loss\n1,abc\n")
    with pytest.raises(ReportError, match="bad.csv:2"):
        read_loss_curve(bad)
    nocol = tmp_path / "nocol.csv"
    nocol.write_text("epoch,value\n1,2\n")
    with pytest.raises(ReportError, match="'loss'"):
        read_loss_curve(nocol)
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        write_report(SUMMARY, tmp_path / "r", loss_curves={"x": tmp_path / "missing.csv"})
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_trivial_and_direct_rows_explained_no_retention_without_a_student_entry():
    summary = {"sst2": {"teacher": {"accuracy": 0.9, "passed_gate": True},
                        "trivial": {"accuracy": 0.5, "baseline_of": "teacher"},
                        "tiny4": {"accuracy": 0.88, "retention": 0.88 / 0.9},
                        "tiny4-direct": {"accuracy": 0.8, "retention": 0.8 / 0.9, "baseline_of": "tiny4"}}}
    tasks, rows = build_rows(summary, teacher="teacher")
    by_name = {r["model"]: r for r in rows}
    assert by_name["trivial"]["retention"] is None  # a floor, not a student
    assert by_name["tiny4-direct"]["retention"] == pytest.approx(0.8 / 0.9)
    md = render_markdown(tasks, rows, ["Dev scores on a random subset."])
    assert "trivial: the floor a teacher must beat: the majority class" in md and "Rows ending in -direct" in md
    assert "SQuAD paper" not in md  # a GLUE table does not describe the span baseline
    assert md.splitlines()[0].endswith("Dev scores on a random subset.")
    assert "not above direct" not in md
    summary["sst2"]["tiny4"]["gain_over_direct"] = -0.01  # loses to its direct baseline: the row says so
    marked = render_markdown(*build_rows(summary, teacher="teacher"))
    assert "| tiny4 (not above direct: sst2) |" in marked and "never makes it champion" in marked
    # a span task's trivial row is what it is: whole sentences by question overlap, this project's own floor
    span = render_markdown(["sst2", "squad"], rows)
    assert "the majority class" in span and "not a baseline of the SQuAD paper" in span


def test_the_pareto_front_is_what_no_model_beats_on_both_axes():
    from distillery.report import pareto_front

    points = [(1.0, 80.0), (2.0, 85.0), (3.0, 84.0), (4.0, 90.0), (0.5, 70.0), (2.0, 83.0)]
    assert pareto_front(points) == [4, 0, 1, 3]  # by latency; (3, 84), (2, 83) are beaten by (2, 85)


def test_loss_curves_get_one_panel_per_stage(tmp_path):
    """19 curves of 7 stages: 7 panels, each legend listing only its stage's items."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from distillery import report

    made = []
    real_subplots = plt.subplots

    def spy(*args, **kwargs):
        fig, axes = real_subplots(*args, **kwargs)
        made.append(axes)
        return fig, axes

    curves = {f"{stage}-s{i}": ([0.0, 1.0], [2.0, 1.0]) for stage in ("pretrain", "general_distillation",
                                                                          "task_distillation") for i in range(6)}
    curves["finetune_teacher-demo"] = ([0.0, 1.0], [1.0, 0.5])
    plt.subplots = spy
    try:
        report._curve_panels(curves, tmp_path / "loss_curves.png")
    finally:
        plt.subplots = real_subplots
    axes = [ax for ax in made[0].flat if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["pretrain", "general distillation", "task distillation",
                                               "finetune teacher"]
    assert [t.get_text() for t in axes[1].get_legend().get_texts()] == [f"s{i}" for i in range(6)]
    assert (tmp_path / "loss_curves.png").stat().st_size > 0


def test_the_run_in_words_names_the_best_student_its_retention_speedup_and_gain():
    from distillery.report import verdicts

    summary = {"sst2": {"teacher": {"accuracy": 0.9}, "trivial": {"accuracy": 0.5},
                        "a": {"accuracy": 0.88, "speedup_b1": 3.04, "speedup_b1_int8": 7.5, "gain_over_direct": 0.031},
                        "a-direct": {"accuracy": 0.849}, "a-int8": {"accuracy": 0.87},
                        "b": {"accuracy": 0.8, "speedup_b1": 5.0, "gain_over_direct": -0.01}},
               "cola": {"teacher": {"mcc": 0.0}, "a": {"mcc": 0.1}}}
    assert verdicts(summary, ["a", "b"]) == [
        "sst2: best student a 0.8800 = 0.98 of the teacher's 0.9000, 3.0x faster at batch 1 (7.5x in int8), +3.1 "
        "points over the same student without distillation; 1 of 2 students beat their direct baseline",
        "cola: best student a 0.1000 (teacher 0.0000)"]


def test_the_rows_line_says_what_each_student_and_baseline_read():
    summary = {"sst2": {"teacher": {"accuracy": 0.9},
                        "a": {"accuracy": 0.8, "train_rows_gold": 8000, "train_rows_augmented": 0,
                              "train_rows_unlabeled": 59349},
                        "a-direct": {"accuracy": 0.7, "train_rows_gold": 8000}},
               "cola": {"teacher": {"mcc": 0.5}}}
    assert rows_lines(summary) == [
        "Training rows on sst2 (gold / augmented / unlabelled): a 8,000 / 0 / 59,349; a-direct 8,000 / 0 / 0"]
