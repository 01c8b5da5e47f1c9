"""`distillery augment ...`: TinyBERT data augmentation of a GLUE training file into a TSV."""

from __future__ import annotations

import argparse
from pathlib import Path

from distillery import precision
from distillery.errors import (InputNotFoundError, OutputExistsError, UserError, int_at_least, non_negative_int,
                               positive_int, probability)


def _run(args: argparse.Namespace) -> int:
    from distillery.augment.algorithm import AugmentConfig
    from distillery.augment.dataset import augment_file
    from distillery.augment.glove import load_word_vectors
    from distillery.augment.mlm import load_masked_lm
    from distillery.glue.loaders import task_dir
    from distillery.glue.tasks import get_task

    precision.resolve(args.precision)  # bf16 where the device has no fast bf16: one error line before any work
    spec = get_task(args.task)
    if args.input is not None:
        source = Path(args.input)
    else:
        if "train" not in spec.files:
            raise UserError(f"augment: task {spec.name} has no train split; give --input FILE")
        source = task_dir(spec, args.data_dir) / spec.files["train"]
    if not source.is_file():
        raise InputNotFoundError(f"augment: input file {source} not found")
    check_output_file(Path(args.output), source)
    model, tokenizer = load_masked_lm(args.mlm, device=args.device)
    vectors = load_word_vectors(args.glove, max_words=args.max_words, cache_dir=args.cache_dir)
    config = AugmentConfig(
        k=args.k, p_t=args.p_t, n_aug=args.n_aug, seed=args.seed, batch_size=args.batch_size, fast=args.fast,
        drop_original=args.drop_original, drop_punctuation=args.drop_punctuation,
        drop_subwords=args.drop_subwords, restore_case=args.restore_case, max_seq_length=args.max_seq_length,
    )
    with precision.use(args.precision):
        out = augment_file(spec.name, source, model, tokenizer, vectors, config, args.output,
                           max_examples=args.max_examples, progress=not args.quiet)
    print(f"augmented {source} -> {out}")
    return 0


def check_output_file(out: Path, source: Path) -> None:
    """The augmented file may replace only an earlier augmented file (its header is the mark): never the
    input, a directory, or a file of the user's."""
    from distillery.glue.loaders import AUGMENTED_HEADER

    if out.resolve() == source.resolve():
        raise OutputExistsError(f"augment: --output {out} is the input file; write the augmented set elsewhere")
    if out.is_dir():
        raise OutputExistsError(f"augment: --output {out} is a directory; give a file path")
    if out.exists():
        with open(out, "rb") as f:
            head = f.readline()
        if head.split(b"\t", 1)[0].strip() != AUGMENTED_HEADER.encode():
            raise OutputExistsError(f"augment: --output {out} exists and is not an augmented file written by "
                                    "`distillery augment`; it is left as it is: choose another path or remove it")


def add_commands(subparsers) -> None:
    """Add `augment --task T (--input FILE | --data-dir DIR) --mlm DIR --glove FILE --output FILE ...`."""
    p = subparsers.add_parser("augment", help="TinyBERT data augmentation (Algorithm 1) of a GLUE train file")
    p.add_argument("--task", required=True, help="GLUE task name (cola, sst2, mrpc, ...)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="a GLUE-format split file of the task")
    src.add_argument("--data-dir", help="GLUE download layout root; its <Task>/train.tsv is augmented")
    p.add_argument("--mlm", required=True, help="masked-LM directory (save_pretrained layout, with tokenizer)")
    p.add_argument("--glove", required=True, help="GloVe / word2vec text file")
    p.add_argument("--output", required=True, help="augmented TSV to write")
    p.add_argument("--n-aug", type=non_negative_int, default=None, help="tries per sentence N_a (default: the task's official value)")
    p.add_argument("--k", type=positive_int, default=15, help="candidates per word K")
    p.add_argument("--p-t", type=probability, default=0.4, help="replacement probability p_t")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fast", action="store_true", help="approximate fast mode: one MLM forward per sentence")
    p.add_argument("--max-words", type=positive_int, default=100_000, help="GloVe words kept (first N of the file)")
    p.add_argument("--cache-dir", default=None, help="where the binary GloVe cache goes (default: beside the file)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="masked copies per MLM forward")
    p.add_argument("--max-seq-length", type=int_at_least(4), default=512)
    p.add_argument("--max-examples", type=positive_int, default=None, help="augment only the first N examples")
    p.add_argument("--drop-original", action="store_true", help="never propose the masked word itself")
    p.add_argument("--drop-punctuation", action="store_true", help="never propose punctuation or special tokens")
    p.add_argument("--drop-subwords", action="store_true", help="rank whole words only (K whole-word candidates)")
    p.add_argument("--restore-case", action="store_true", help="re-apply the input casing to output words")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--precision", choices=precision.SETTINGS, default="auto",
                   help="the MLM's forwards: auto = bf16 autocast where the device is fast at it (distillery.precision)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
