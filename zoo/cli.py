"""The `zoo` command line: list, info, train, generate, classify, transcribe, fold, export."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from zoo.recipe_options import help_text
from zoo.recipes import apply_overrides, get_recipe, recipes
from zoo.store import CARD_FILE, list_models, locate, read_config

TRAIN_USAGE = "zoo train RECIPE [--nproc N] [--OPTION VALUE ...]   (zoo train RECIPE --help lists its options)"


def _parse_overrides(words: list[str]) -> dict[str, str]:
    overrides = {}
    index = 0
    while index < len(words):
        word = words[index]
        if not word.startswith("--") or word == "--":
            raise ValueError(f"expected --field value; got {word!r}")
        if "=" in word:
            key, value = word[2:].split("=", 1)
            index += 1
        else:
            if index + 1 >= len(words):
                raise ValueError(f"{word} needs a value")
            key, value = word[2:], words[index + 1]
            index += 2
        overrides[key] = value
    return overrides


def cmd_list(_: argparse.Namespace) -> None:
    for name, folder in list_models().items():
        print(f"{name:28s} {read_config(folder)['arch']:8s} {folder}")
    for name, recipe in recipes().items():
        print(f"recipe {name:21s} -> {', '.join(recipe.produces)}: {recipe.description}")


def cmd_info(args: argparse.Namespace) -> None:
    print((locate(args.name) / CARD_FILE).read_text())


def cmd_train(args: argparse.Namespace, rest: list[str]) -> None:
    if args.recipe is None:
        print(TRAIN_USAGE + "\nrecipes:\n" + "".join(f"  {name:18s} {r.description}\n" for name, r in recipes().items()))
        return
    recipe = get_recipe(args.recipe)
    if args.help:
        print(help_text(recipe.name, recipe.description, recipe.config_class()), end="")
        return
    config = apply_overrides(recipe.config_class(), _parse_overrides(rest))
    if args.nproc > 1 and "RANK" not in os.environ:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                   "-m", "zoo.cli", "train", args.recipe, *rest]
        environment = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        raise SystemExit(subprocess.call(command, env=environment))
    from trainers.distributed import exit_process, shutdown_distributed

    recipe.run(config)
    shutdown_distributed()
    exit_process(0)


def cmd_generate(args: argparse.Namespace) -> None:
    from nlp.generate import generate_text  # the CLI sits on top of the domains

    print(generate_text(args.name, args.prompt, max_new_tokens=args.tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed))


def cmd_classify(args: argparse.Namespace) -> None:
    from vision.classify import classify_files  # the CLI sits on top of the domains

    for prediction in classify_files(args.name, args.images, top_k=args.top):
        ranked = "  ".join(f"{label} {p:.4f}" for label, p in zip(prediction.labels, prediction.probabilities))
        print(f"{prediction.path}: {ranked}")


def cmd_transcribe(args: argparse.Namespace) -> None:
    from asr import transcribe  # the CLI sits on top of the domains

    texts = transcribe(args.name, args.files, method=args.method, beam=args.beam, lm_weight=args.lm_weight,
                       ilm_weight=args.ilm_weight)
    for path, text in zip(args.files, texts):
        print(f"{path}: {text}")


def cmd_fold(args: argparse.Namespace) -> None:
    from protein import fold  # the CLI sits on top of the domains

    prediction = fold(args.name, args.sequence, recycles=args.recycles)
    prediction.write_pdb(args.output)
    print(f"{args.output}: {len(prediction.sequence)} residues, mean pLDDT {prediction.plddt.mean().item() * 100:.1f}")


def cmd_export(args: argparse.Namespace) -> None:
    from zoo.hf import export_hf
    from zoo.store import load

    print(export_hf(load(args.name), args.directory))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zoo", description="memzoo: train and use memory-lean models")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="models and recipes")
    info = commands.add_parser("info", help="show a model's card")
    info.add_argument("name")
    # The recipe's own options come after its name; --help then lists them (see zoo.recipe_options).
    train = commands.add_parser("train", help="run a recipe: zoo train RECIPE [--field value ...] [--nproc N]",
                                add_help=False, usage=TRAIN_USAGE)
    train.add_argument("recipe", nargs="?")
    train.add_argument("-h", "--help", action="store_true", help="list the recipe's options")
    train.add_argument("--nproc", type=int, default=1, help="processes (ranks); >1 launches torchrun")
    generate = commands.add_parser("generate", help="continue a prompt with a language model")
    generate.add_argument("name")
    generate.add_argument("prompt")
    generate.add_argument("--tokens", type=int, default=200)
    generate.add_argument("--temperature", type=float, default=0.8)
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--seed", type=int, default=0)
    classify = commands.add_parser("classify", help="label images with an image classifier")
    classify.add_argument("name")
    classify.add_argument("images", nargs="+", metavar="IMAGE")
    classify.add_argument("--top", type=int, default=3, help="classes to show per image, most probable first")
    transcribe = commands.add_parser("transcribe", help="transcribe WAV files with a speech recogniser")
    transcribe.add_argument("name")
    transcribe.add_argument("files", nargs="+", metavar="FILE.wav")
    transcribe.add_argument("--method", choices=["beam", "greedy"], default="beam")
    transcribe.add_argument("--beam", type=int, default=None, help="beam of the beam search (default: the model's own)")
    transcribe.add_argument("--lm-weight", type=float, default=None,
                            help="weight of the model's language model in beam search (default: the model's; 0: off)")
    transcribe.add_argument("--ilm-weight", type=float, default=None,
                            help="weight of the internal language model subtracted in the fusion (default: the model's)")
    fold = commands.add_parser("fold", help="predict a protein backbone and write it as PDB")
    fold.add_argument("name")
    fold.add_argument("sequence", help="one-letter amino-acid sequence")
    fold.add_argument("-o", "--output", required=True, help="PDB file to write")
    fold.add_argument("--recycles", type=int, default=None, help="recycling passes (default: the model's)")
    export = commands.add_parser("export", help="write a model as a Hugging Face folder (GPT-2, BERT)")
    export.add_argument("name")
    export.add_argument("directory")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "train":
            cmd_train(args, rest)
            return
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        {"list": cmd_list, "info": cmd_info, "generate": cmd_generate, "classify": cmd_classify,
         "transcribe": cmd_transcribe, "fold": cmd_fold, "export": cmd_export}[args.command](args)
    except ValueError as error:
        parser.exit(2, f"zoo: error: {error}\n")


if __name__ == "__main__":
    main()
