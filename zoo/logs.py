"""How the `zoo` command line sets up Python logging: one level for every rank of a run.

Libraries (trainers, the domains) only log through `logging.getLogger(__name__)`; this module is
the one place a process configures where those records go. The level comes from `zoo --log-level`
and reaches torchrun's ranks as $MEMZOO_LOG_LEVEL.
"""

from __future__ import annotations

import logging
import os

LEVELS = ("debug", "info", "warning", "error")
LEVEL_VARIABLE = "MEMZOO_LOG_LEVEL"


def configure_logging(level: str | None = None) -> str:
    """Log records of `level` (default $MEMZOO_LOG_LEVEL, else "info") and above to stderr, each line
    tagged with the time and, under torchrun, the rank; returns the level used. Ranks other than 0
    show warnings and errors only, so a run's progress is told once."""
    level = (level or os.environ.get(LEVEL_VARIABLE) or "info").lower()
    if level not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}; got {level!r}")
    rank = os.environ.get("RANK")
    tag = f" rank {rank}" if rank is not None else ""
    effective = level if rank in (None, "0") else max(level, "warning", key=LEVELS.index)
    logging.basicConfig(level=effective.upper(), format=f"%(asctime)s{tag} %(name)s %(levelname)s: %(message)s",
                        datefmt="%H:%M:%S", force=True)
    os.environ[LEVEL_VARIABLE] = level
    return level
