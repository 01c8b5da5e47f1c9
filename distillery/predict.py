"""``distillery predict``: a saved classifier's predictions of every row of a prepared task, as a file a teacher known
by its predictions reads (``teacher.predictions``, `distillery.teacher_predictions`)."""

from __future__ import annotations

from pathlib import Path


def _predict(args) -> int:
    import datasets

    from distillery import precision, teacher_predictions
    from distillery.preflight import load_params, project_root
    from distillery.training.task_data import load_prepared

    datasets.disable_progress_bars()  # one line for the whole command
    p = load_params(args.params).for_task(args.task)  # registers the params' tasks of your own
    data = load_prepared(Path(args.data or project_root(args.params, None) / "data" / "tasks" / args.task),
                         unlabeled=True)
    with precision.use(p.precision):  # as the pipeline's logits cache computes them
        n = teacher_predictions.write(Path(args.model), args.task, data, Path(args.out), p.data.max_length, args.values)
    print(f"{args.out}: {n} rows ({args.values}) of {args.task} from {args.model}")
    return 0


def add_commands(subparsers) -> None:
    cmd = subparsers.add_parser("predict", help="a saved classifier's predictions of a prepared task, as a teacher's "
                                                "predictions file (teacher.predictions)")
    cmd.add_argument("model", help="the saved model directory (e.g. models/teacher/sst2/model)")
    cmd.add_argument("--task", required=True, help="the task (its rows: <project>/data/tasks/<task>)")
    cmd.add_argument("--out", required=True, help="the JSON Lines file to write")
    cmd.add_argument("--params", default="params.yaml", help="the project's params (its max_length, its own tasks)")
    cmd.add_argument("--data", help="the prepared task directory (default: the params' project's data/tasks/<task>)")
    cmd.add_argument("--values", choices=("probabilities", "logits"), default="probabilities")
    cmd.set_defaults(func=_predict)
