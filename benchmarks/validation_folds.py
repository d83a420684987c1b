"""The command line shared by the benchmarks that fold the shipped ProMod3 set's validation chains
(fold_realisation.py, fold_confidence.py, fold_confidence_readings.py): MODEL [--chains N] [--threads T]."""

from __future__ import annotations

import argparse

import torch

from protein.data import ProteinChain
from protein.fit_confidence import benchmark_chains
from protein.model import FoldingModel
from zoo.store import load


def model_and_chains(description: str, chains: int) -> tuple[FoldingModel, list[ProteinChain], argparse.Namespace]:
    """The model (in eval mode) and every other validation chain of the shipped set, up to --chains
    (default `chains`; protein.fit_confidence.benchmark_chains, which no confidence readout is fitted
    on), with torch's threads set from --threads."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="fold-tiny")
    parser.add_argument("--chains", type=int, default=chains, help="every other validation chain, up to this many")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return load(args.model).eval(), benchmark_chains()[: args.chains], args
