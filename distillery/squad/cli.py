"""`distillery squad ...` sub-commands: file statistics and the official evaluation."""

from __future__ import annotations

import argparse
import json
import sys

from distillery.squad.data import SquadFileError, read_squad
from distillery.squad.metrics import evaluate, missing_predictions, read_null_odds, read_predictions


def _stats(args: argparse.Namespace) -> int:
    stats = read_squad(args.file, args.version).stats()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    for key, value in stats.items():
        print(f"{key:<11} {value}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    squad = read_squad(args.data_file, args.version)
    gold = {q.id: [text for text, _ in q.answers] for a in squad.articles for p in a.paragraphs for q in p.questions}
    predictions = read_predictions(args.predictions_file)
    if squad.version == "1.1" and args.na_prob_file is not None:
        raise SquadFileError(f"{args.na_prob_file}: null odds are a SQuAD v2.0 input, and {args.data_file} is v1.1")
    na_probs = read_null_odds(args.na_prob_file) if args.na_prob_file is not None else None
    missing = missing_predictions(gold, predictions)
    if squad.version == "1.1":
        if missing:  # the official script says so per question; one line here
            print(f"warning: {len(missing)} of {len(gold)} questions have no prediction and score 0 (first: "
                  f"{missing[0]})", file=sys.stderr)
        print(json.dumps(evaluate(gold, predictions, "1.1")))
        return 0
    if missing:
        raise SquadFileError(f"{args.predictions_file}: no prediction for {len(missing)} of {len(gold)} questions "
                             f"(first: question {missing[0]}); the v2.0 evaluation needs one for every question "
                             "(\"\" = no answer)")
    lacking = [qid for qid in gold if na_probs is not None and qid not in na_probs]
    if lacking:
        raise SquadFileError(f"{args.na_prob_file}: no null odds for {len(lacking)} of {len(gold)} questions (first: "
                             f"question {lacking[0]})")
    print(json.dumps(evaluate(gold, predictions, "2.0", na_probs, args.na_prob_thresh), indent=2))
    return 0


def add_commands(subparsers) -> None:
    """Add `squad stats FILE [--json]` and `squad evaluate DATA_FILE PREDICTIONS_FILE [--na-prob-file F]`."""
    squad = subparsers.add_parser("squad", help="SQuAD reading comprehension: file statistics, official evaluation")
    sub = squad.add_subparsers(dest="squad_command", required=True)
    version = {"choices": ["1.1", "2.0"], "default": None,
               "help": "read the file as this SQuAD version (default: its 'version' field)"}
    stats = sub.add_parser("stats", help="articles, paragraphs, questions, version and impossible questions of FILE")
    stats.add_argument("file", help="an official SQuAD JSON file (e.g. dev-v1.1.json)")
    stats.add_argument("--version", **version)
    stats.add_argument("--json", action="store_true", help="print the counts as JSON")
    stats.set_defaults(func=_stats)
    ev = sub.add_parser("evaluate", help="the official evaluation of a predictions file; prints its JSON (v1.1: "
                                         "exact_match and f1, 0-100; v2.0: exact, f1, HasAns_*, NoAns_*, best_*)")
    ev.add_argument("data_file", help="the official SQuAD JSON file the predictions answer")
    ev.add_argument("predictions_file", help="JSON {question id: answer text} (\"\" = no answer)")
    ev.add_argument("--na-prob-file", default=None, help="v2.0: JSON {question id: null odds} (null_odds.json)")
    ev.add_argument("--na-prob-thresh", type=float, default=1.0,
                    help="v2.0: null odds above this count as 'no answer' (default 1.0, as the official script)")
    ev.add_argument("--version", **version)
    ev.set_defaults(func=_evaluate)
