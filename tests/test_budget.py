"""A latency budget in, the shapes that meet it out (`distillery.efficiency.budget`): the candidate grid, filtering by
measured latency (a fake clock, then the real one on a tiny teacher), one clear error when nothing fits, the
finalists (each shape once, in its most faithful form) and successive halving; a student with a budget instead of a
shape in params (`Recipe.verify`). The search stage itself runs in the end-to-end project (tests/test_pipeline_e2e.py)."""

from __future__ import annotations

import pytest
import transformers

from distillery.efficiency.budget import (Budget, BudgetError, Candidate, Timed, available_forms, candidates,
                                          confirm, finalists, successive_halving, time_candidates, within_budget)
from distillery.shape import Dims

from helpers import ONE_STUDENT, bert_config

pytestmark = pytest.mark.usefixtures("one_thread")

TEACHER = Dims(6, 384, 12, 1536)


def test_candidates_keep_the_teachers_head_size_and_never_its_shape():
    cands = candidates(TEACHER, forms=("fp32", "int8"))
    shapes = {c.shape_name for c in cands}
    assert len(shapes) == 6 * 3 * 2 - 1 and len(cands) == 2 * len(shapes)  # depth x width x FFN, less the teacher's
    assert all(c.hidden // c.heads == 32 and c.hidden % c.heads == 0 for c in cands)
    assert {c.hidden for c in cands} == {384, 288, 192}
    assert {c.intermediate for c in cands if c.hidden == 192} == {768, 384}  # the teacher's 4x, and half of it
    assert "6x384-h12-f1536" not in shapes and "6x384-h12-f768" in shapes
    assert Candidate(3, 192, 6, 768, "int8").name == "3x192-h6-f768-int8"
    with pytest.raises(BudgetError, match="unknown deployed form"):
        candidates(TEACHER, forms=("fp16",))
    with pytest.raises(BudgetError, match=r"depths must lie in 1..6"):
        candidates(TEACHER, depths=[7])


def fake_clock(per_layer_ms: dict[str, float]):
    """ms = layers x width/32 x the form's per-layer cost; the teacher (4 x 32) 60 ms."""
    def timer(models, precisions):
        out = {"teacher": 60.0}
        for name in models:
            if name == "teacher":
                continue
            shape, form = name.rsplit("-", 1)
            layers, hidden = (int(v) for v in shape.split("-")[0].split("x"))
            assert (precisions.get(name) == "bf16") == (form == "bf16")
            out[name] = layers * hidden / 32 * per_layer_ms[form]
        return out

    return timer


def tiny_teacher():
    return transformers.BertForSequenceClassification(bert_config(100, 4, hidden=32, heads=4, inter=64)).eval()


def test_the_budget_keeps_the_candidates_the_clock_puts_under_it():
    teacher = tiny_teacher()
    cands = candidates(Dims.of_config(teacher.config), depths=[1, 2, 3], forms=("fp32", "bf16", "int8"))
    budget = Budget(speedup=3)
    teacher_ms, timed = time_candidates(teacher, cands, budget, timer=fake_clock({"fp32": 10, "bf16": 5, "int8": 4}))
    assert teacher_ms == 60 and [t.ms for t in timed] == sorted(t.ms for t in timed)
    keep = within_budget(timed, teacher_ms, budget)
    assert keep and all(t.ms <= 20 for t in keep)
    assert {t.candidate.name for t in timed if t.ms <= 20} == {t.candidate.name for t in keep}
    # the largest shape first: 3 layers x 32 wide fits only in int8 (3 x 4 = 12 ms) or bf16 (15 ms), int8 faster
    assert keep[0].candidate.name == "3x32-h4-f64-int8" and keep[0].speedup == pytest.approx(5.0)
    assert not any(t.candidate.layers == 3 and t.candidate.hidden == 32 and t.candidate.form == "fp32" for t in keep)
    # a latency bound tighter than the speedup wins
    assert all(t.ms <= 6 for t in within_budget(timed, teacher_ms, Budget(speedup=3, latency_ms=6)))


def test_int8_candidates_are_timed_in_fresh_sessions_and_keep_the_median(tmp_path):
    teacher = tiny_teacher()
    cands = candidates(Dims.of_config(teacher.config), depths=[1], width_fractions=(1,), ffn_ratios=(1,),
                       forms=("fp32", "int8"))
    seen: list[dict] = []
    draws = iter([9.0, 2.0, 5.0])  # one int8 figure per session: the median is 5, the first 9, the least 2

    def timer(models, precisions):
        seen.append(dict(models))
        return {"teacher": 60.0, "1x32-h4-f64-fp32": 30.0 + len(seen), "1x32-h4-f64-int8": next(draws)}

    teacher_ms, timed = time_candidates(teacher, cands, Budget(speedup=2), timer=timer, workdir=tmp_path)
    assert len(seen) == 3 and teacher_ms == 60
    assert {t.candidate.name: t.ms for t in timed} == {"1x32-h4-f64-int8": 5.0, "1x32-h4-f64-fp32": 32.0}
    sessions = [m["1x32-h4-f64-int8"] for m in seen]
    assert len({id(s) for s in sessions}) == 3 and len({s.path for s in sessions}) == 1  # fresh sessions, one file
    assert all(m["teacher"] is teacher and m["1x32-h4-f64-fp32"] is seen[0]["1x32-h4-f64-fp32"] for m in seen)
    with pytest.raises(BudgetError):
        time_candidates(teacher, cands, Budget(speedup=2), timer=timer, sessions=0)


def test_each_finalist_is_timed_again_alone_and_one_that_misses_then_gives_its_place(tmp_path):
    """The pass over every candidate said the largest shape met the budget; timed alone beside the teacher it does
    not: the next in line is the finalist, with its second figures; nothing holding is one error."""
    teacher = tiny_teacher()
    cands = candidates(Dims.of_config(teacher.config), depths=[1, 2, 3], width_fractions=(1,), ffn_ratios=(1,),
                       forms=("fp32",))
    budget = Budget(speedup=2)
    passes: list[list[str]] = []

    def timer(models, precisions):
        alone = len(models) == 2
        if alone:
            passes.append([n for n in models if n != "teacher"])
        # the long pass: every shape 20 ms (3x); alone: 3 layers 40 ms (1.5x), the others 25 ms (2.4x)
        return {"teacher": 60.0, **{n: (40.0 if alone and n.startswith("3x") else 25.0 if alone else 20.0)
                                    for n in models if n != "teacher"}}

    teacher_ms, timed = time_candidates(teacher, cands, budget, timer=timer, workdir=tmp_path)
    keep = within_budget(timed, teacher_ms, budget)
    assert [t.candidate.layers for t in finalists(keep, 1)] == [3]
    final = confirm(teacher, keep, budget, 1, timer=timer, workdir=tmp_path)
    assert passes == [["3x32-h4-f64-fp32"]] * 3 + [["2x32-h4-f64-fp32"]] * 3  # each in three sessions, as the pass
    assert [(t.candidate.name, t.ms, t.speedup) for t in final] == [("2x32-h4-f64-fp32", 25.0, 2.4)]
    with pytest.raises(BudgetError, match="when timed again alone beside the fp32 teacher: 3x32-h4-f64-fp32 1.50x"):
        confirm(teacher, keep, Budget(speedup=2.5), 1, timer=timer, workdir=tmp_path)


def test_a_budget_no_candidate_meets_names_the_budget_and_the_fastest():
    teacher = tiny_teacher()
    cands = candidates(Dims.of_config(teacher.config), depths=[2, 3], forms=("fp32",))
    teacher_ms, timed = time_candidates(teacher, cands, Budget(speedup=20), timer=fake_clock({"fp32": 10}))
    with pytest.raises(BudgetError) as err:
        within_budget(timed, teacher_ms, Budget(speedup=20))
    msg = str(err.value)
    assert "speedup >= 20x over the fp32 teacher at batch 1, length 128" in msg and "<= 3.00 ms" in msg, msg
    assert "the fastest, 2x16-h2-f32-fp32, takes 10.00 ms (6.00x)" in msg and "\n" not in msg, msg
    for bad in ({}, {"speedup": 0}, {"latency_ms": -1}, {"speedup": 2, "batch": 0}):
        with pytest.raises(BudgetError):
            Budget(**bad)


def test_the_real_clock_times_every_form_of_random_weight_students(tmp_path):
    teacher = tiny_teacher()
    forms = available_forms()  # bf16 only on a CPU with fast bf16 (CI machines may have AVX2 alone)
    assert {"fp32", "int8"} <= set(forms)
    cands = candidates(Dims.of_config(teacher.config), depths=[1], width_fractions=(1,), ffn_ratios=(1,), forms=forms)
    budget = Budget(latency_ms=1e6, seq_len=16)
    teacher_ms, timed = time_candidates(teacher, cands, budget, workdir=tmp_path)
    assert teacher_ms > 0 and {t.candidate.form for t in timed} == set(forms)
    assert all(t.ms > 0 and 0 < t.speedup_low <= t.speedup and t.ms_high >= t.ms for t in timed)
    assert (tmp_path / "1x32-h4-f64-int8.onnx").is_file()
    assert len(within_budget(timed, teacher_ms, budget)) == len(forms)


def test_the_budget_command_prints_the_shapes_that_meet_it_and_refuses_an_impossible_one(tmp_path, capsys):
    from distillery.cli import main as cli

    teacher = tiny_teacher()
    teacher.save_pretrained(tmp_path / "teacher")
    argv = ["budget", str(tmp_path / "teacher"), "--depths", "1", "--forms", "fp32,int8", "--seq", "16", "--reps", "2"]
    assert cli(argv + ["--speedup", "1.2", "--json", str(tmp_path / "shapes.json")]) == 0
    out = capsys.readouterr().out
    assert "fp32 teacher:" in out and "| candidate | layers |" in out and "-int8 |" in out, out
    import json

    rows = json.loads((tmp_path / "shapes.json").read_text())["candidates"]
    assert len(rows) == 6 * 2 and any(r["meets_budget"] for r in rows.values())  # shapes x forms
    argv[argv.index("fp32,int8")] = "fp32"  # the refusal needs no int8 export
    assert cli(argv + ["--speedup", "1000", "--json", str(tmp_path / "shapes.json")]) == 2  # its own file: kept
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: no candidate meets the budget (speedup >= 1000x"), err


def test_finalists_take_each_shape_once_in_its_most_faithful_form_and_each_depth_first():
    def timed(layers, form, ms, params, hidden=384):
        return Timed(Candidate(layers, hidden, hidden // 32, 4 * hidden, form), ms, 10 / ms, params)

    keep = [timed(3, "int8", 1.0, 30), timed(3, "bf16", 1.5, 30), timed(2, "int8", 0.8, 20), timed(2, "fp32", 1.9, 20),
            timed(1, "int8", 0.5, 10), timed(4, "int8", 1.9, 40)]
    got = finalists(keep, 3)
    assert [t.candidate.name for t in got] == ["4x384-h12-f1536-int8", "3x384-h12-f1536-bf16", "2x384-h12-f1536-fp32"]
    assert len(finalists(keep, 10)) == 4
    # wide shapes hold the most parameters (the embeddings): a narrower shape of another depth still gets its turn
    keep = [timed(2, "int8", 1.0, 16), timed(2, "int8", 0.9, 15, 288), timed(1, "fp32", 0.8, 14),
            timed(3, "int8", 1.1, 11, 288), timed(1, "int8", 0.7, 13, 288)]
    assert [t.candidate.name for t in finalists(keep, 3)] == ["2x384-h12-f1536-int8", "1x384-h12-f1536-fp32",
                                                               "3x288-h9-f1152-int8"]
    assert finalists(keep, 4)[-1].candidate.name == "2x288-h9-f1152-int8"


def test_successive_halving_keeps_the_better_half_with_twice_the_examples():
    quality = {"a": 0.5, "b": 0.9, "c": 0.7, "d": 0.9, "e": 0.1}
    calls = []

    def score(name, examples):
        calls.append((name, examples))
        return quality[name] + examples / 1e6  # more data, slightly better: the ranking within a round is the point

    winner, rounds = successive_halving(list(quality), score, 100)
    # 5 -> 3 (rounded up) -> 2 -> 1; b and d tie in every round: the earlier name (the larger shape) goes first
    assert [sorted(r) for r in rounds] == [list("abcde"), ["b", "c", "d"], ["b", "d"]]
    assert winner == "b"
    assert calls[:5] == [(n, 100) for n in "abcde"] and {e for _, e in calls[5:8]} == {200} and calls[-1][1] == 400
    assert successive_halving(["only"], score, 100) == ("only", [])
    with pytest.raises(BudgetError):
        successive_halving([], score, 100)


def test_a_student_gives_a_shape_or_a_budget_and_the_budget_must_be_searchable():
    from distillery.config import ConfigError, parse_params
    from distillery.recipes import RECIPES
    from distillery.recipes.base import RecipeError

    shape = {"layers": 2, "hidden": 384, "heads": 12, "intermediate": 1536}
    for student, message in (({"shape": shape, "budget": {"speedup": 5}}, "not both"), ({}, "not neither"),
                             ({"budget": {}}, "needs speedup"),
                             ({"budget": {"speedup": 5, "forms": []}}, r"forms: List should have at least 1 item"),
                             ({"budget": {"speedup": 5, "ffn_ratios": []}}, r"ffn_ratios: List should have at least")):
        with pytest.raises(ConfigError, match=message):
            parse_params({"students": {"s": {"recipe": "tinybert", **student}}}, "params.yaml")
    from distillery.recipes import budget_shapes, verify, with_shape

    tinybert = RECIPES["tinybert"]
    with_attention = tinybert(recipe="tinybert", init="pruned", budget={"speedup": 5})
    names = {f"{s['layers']}x{s['hidden']}" for s in budget_shapes(with_attention, TEACHER, "students.s")}
    assert names == {f"{d}x384" for d in range(1, 7)}  # attention_loss compares the teacher's 12 heads
    hidden_only = tinybert(recipe="tinybert", init="pruned", budget={"speedup": 5, "depths": [2, 3]},
                           objectives={"hidden_loss": 1.0, "embedding_loss": 1.0})
    assert {s["hidden"] for s in budget_shapes(hidden_only, TEACHER, "students.s")} == {384, 288, 192}
    cut_after = tinybert(recipe="tinybert", init={"pruned": {"source": "student"}},
                         budget={"speedup": 5, "depths": [2, 3]})
    assert {s["hidden"] for s in budget_shapes(cut_after, TEACHER, "students.s")} == {384, 288, 192}  # the twin distils
    assert with_shape(hidden_only, shape).shape.layers == 2 and with_shape(hidden_only, shape).budget is None
    for recipe, init, message in (("tinybert", "random", "after general distillation would run"),
                                  ("tinybert", {"pruned": {"teacher_layers": [1, 3]}}, "give 'auto'"),
                                  ("mobilebert", "random", "after general distillation would run"),
                                  ("tinybert", {"checkpoint": "some/model"}, "a checkpoint fixes the student's shape")):
        with pytest.raises(RecipeError, match=message):
            verify(RECIPES[recipe](recipe=recipe, init=init, budget={"speedup": 5}), TEACHER, "students.s")
    no_fit = RECIPES["pkd"](recipe="pkd", init="teacher_layers", budget={"speedup": 5, "depths": [1]})
    with pytest.raises(RecipeError, match=r"students.s.budget: none of its \d+ candidate shapes works"):
        verify(no_fit, TEACHER, "students.s")  # a 1-layer PKD student has no intermediate layer


def test_a_margin_keeps_part_of_the_limit_free():
    assert Budget(speedup=5, margin=0.1).limit_ms(50.0) == pytest.approx(9.0)
    assert Budget(latency_ms=8, speedup=5, margin=0.5).limit_ms(50.0) == pytest.approx(4.0)
    assert "10% margin" in Budget(speedup=5, margin=0.1).describe()
    with pytest.raises(BudgetError, match="margin"):
        Budget(speedup=5, margin=1.0)


def test_a_search_with_no_teacher_past_the_gate_skips_and_so_do_its_students_stages(tmp_path, monkeypatch):
    """Every task's teacher failed the gate: the search leaves skip records (not nothing), and the stages that need
    its shape (the direct baseline, which reads no gate) skip with its reason instead of failing on a missing file."""
    from distillery.config import parse_params
    from tasks import distill, paths, search, stage
    from tasks.teacher import TeacherGateError

    monkeypatch.setattr(paths, "MODELS", tmp_path / "models")
    monkeypatch.setattr(stage, "STAMPS", tmp_path / "stamps")
    monkeypatch.setattr(search, "gate_failure", lambda p, task: TeacherGateError(f"{task}: teacher below trivial"))
    p = parse_params({**ONE_STUDENT, "students": {"s": {"recipe": "tinybert", "init": "pruned",
                                                        "budget": {"speedup": 5, "depths": [1]}}}}, "params.yaml")
    with pytest.raises(FileNotFoundError, match="search has not run"):
        distill.recipe_of(p, "s")
    assert stage.run_stage(search.SEARCH, p, "s", key="k") == {"skipped": "every task's teacher failed the gate"}
    assert stage.skipped(paths.search("s")) == "every task's teacher failed the gate"
    with pytest.raises(stage.SkipStage, match="its search skipped: every task's teacher failed the gate"):
        distill.recipe_of(p, "s")


def test_a_budget_form_the_run_does_not_evaluate_is_refused_before_any_work():
    """bf16 is served (searched, registered) only where the run trains in bf16: the evaluate stage measures it."""
    from distillery.config import ConfigError, parse_params
    from distillery.preflight import check_params

    raw = {"precision": "fp32", "teacher": {"init": "scratch", "shape": {"layers": 2, "hidden": 32, "heads": 2,
                                                                         "intermediate": 64}},
           "students": {"s": {"recipe": "tinybert", "init": "pruned", "budget": {"speedup": 2, "forms": ["bf16"]}}}}
    with pytest.raises(ConfigError, match=r"students\.s\.budget\.forms: bf16 is not served in this run "
                                          r"\(precision: fp32 runs fp32"):
        check_params(parse_params(raw))
    raw["students"]["s"]["budget"]["forms"] = ["int8"]
    check_params(parse_params(raw))


def test_a_budgeted_students_stage_before_its_search_says_so_in_one_line():
    from distillery.config import parse_params
    from distillery.errors import InputNotFoundError
    from tasks.distill import recipe_of

    p = parse_params({"teacher": {"init": "scratch", "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}},
                      "students": {"never-searched-s": {"recipe": "tinybert", "init": "pruned",
                                                        "budget": {"speedup": 2}}}})
    with pytest.raises(InputNotFoundError, match=r"never-searched-s has a budget and its search has not run: run it "
                                                 r"first \(python -m flows\.stage search --item never-searched-s"):
        recipe_of(p, "never-searched-s")
