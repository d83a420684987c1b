"""The folding model: input embedding, recycling, Evoformer, structure module, distogram and pLDDT heads.

    input_ids (B, L) residue ids, attention_mask (B, L) 1 = residue, position_ids (B, L) residue
    numbers, msa_features (B, S, L, MSA_FEATURES), msa_mask (B, S, L)
    [labels: coordinates (B, L, 5, 3) Å of N, CA, C, O, CB and atom_mask (B, L, 5); optionally
     secondary_structure (B, L) three-state ids (H, E, C = 0, 1, 2; -100 ignored) and profile
     (B, L, 20) the chain's amino-acid frequencies, the target of the profile head wherever the
     input withheld it (msa_features' has-profile flag 0)]
    -> {"backbone" (B, L, 3, 3) N/CA/C, "plddt" (B, L) in [0, 1], "secondary_structure_logits"
        (B, L, 3), and without labels "distogram_logits" (B, L, L, bins), with labels "loss", "fape",
        "distogram_loss", "plddt_loss", "secondary_structure_loss" and "profile_loss" instead (the loss is chunked
        like the Evoformer, so the logits never exist whole)}

Recycling (Algorithm 2): the model runs 1 + `recycles` times, each pass seeing the previous pass's
first MSA row, pair representation and Cα distances; only the last pass records gradients. In
training the number of recycles is drawn uniformly from 0..max_recycles by a generator seeded with
the training step (the trainer calls `set_training_step`), so every rank runs the same passes and
their collectives match.
The plan names each Evoformer block as a shard and recompute unit.

The model also holds what `protein.fold` reads the realised fold's pLDDT from, fitted after training
and never run by forward: the sequence-only burial network (`protein.burial`, frozen parameters)
and the confidence readout (`protein.confidence_readout`: buffers, and the per-pair network of
`protein.pair_confidence` with frozen parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from protein.burial import BurialConfig, BurialNet
from protein.chunking import chunk_size_for
from protein.confidence_readout import ConfidenceReadout
from protein.evoformer import Evoformer, EvoformerConfig
from protein.features import MSA_FEATURES, msa_features, relative_positions, target_features
from protein.frames import Frames
from protein.losses import distogram_logits, distogram_loss, distogram_targets, fape, plddt_from_logits, plddt_loss
from protein.precision import LayerNorm
from protein.residues import ALPHABET_SIZE, AMINO_ACIDS
from protein.secondary_structure import IGNORE_INDEX, SECONDARY_STRUCTURE_STATES
from protein.structure_module import StructureConfig, StructureModule
from zoo.plan import Carry, ModelPlan, PipelineSplit
from zoo.registry import register


@dataclass
class FoldConfig:
    """Shape, recycling, memory settings and loss weights of the folding model."""

    evoformer: EvoformerConfig = field(default_factory=EvoformerConfig)
    """Evoformer widths and depth."""
    structure: StructureConfig = field(default_factory=StructureConfig)
    """Structure module shape."""
    burial: BurialConfig = field(default_factory=BurialConfig)
    """Shape of the sequence-only burial network the confidence readout reads (protein.burial)."""
    relative_position_clip: int = 32
    """Residue offsets beyond ± this share one relative-position class."""
    max_recycles: int = 3
    """Most recycling passes (training draws 0..max_recycles; inference runs all)."""
    recycle_bins: int = 15
    """Distance bins (3.375-21.375 Å) of the recycled Cα positions."""
    distogram_bins: int = 64
    """Distogram head bins (2.3125-21.6875 Å edges)."""
    plddt_bins: int = 50
    """pLDDT head bins over [0, 1]."""
    chunk_size: int | None = None
    """Slices per chunk of every chunked module: the Evoformer's, IPA, the distogram and FAPE losses
    (None: whole, unless memory_budget)."""
    memory_budget: int | None = None
    """Bytes one chunk's largest intermediate (attention logits, outer products, distogram logits)
    may take; sets each module's chunk size when chunk_size is None."""
    fape_clamp: float = 10.0
    """Å at which FAPE distances are clamped."""
    distogram_weight: float = 0.3
    """Weight of the distogram loss (FAPE has 1)."""
    plddt_weight: float = 0.01
    """Weight of the pLDDT loss."""
    secondary_structure_weight: float = 0.3
    """Weight of the three-state secondary-structure cross-entropy (an auxiliary target; 0: the
    head is trained by nothing)."""
    profile_weight: float = 0.3
    """Weight of the profile head's cross-entropy against the withheld profile (AlphaFold's masked
    MSA objective in the profile's terms: from the sequence alone, predict what evolution allows)."""

    def __post_init__(self) -> None:
        if isinstance(self.evoformer, dict):  # as read back from config.json
            self.evoformer = EvoformerConfig(**self.evoformer)
        if isinstance(self.structure, dict):
            self.structure = StructureConfig(**self.structure)
        if isinstance(self.burial, dict):
            self.burial = BurialConfig(**self.burial)
        if self.max_recycles < 0 or self.relative_position_clip < 1 or min(self.recycle_bins, self.distogram_bins,
                                                                           self.plddt_bins) < 2:
            raise ValueError(f"FoldConfig needs max_recycles >= 0, relative_position_clip >= 1 and >= 2 bins; got "
                             f"{self.max_recycles}, {self.relative_position_clip}, {self.recycle_bins}, "
                             f"{self.distogram_bins}, {self.plddt_bins}")
        if self.chunk_size is not None and self.chunk_size < 1 or self.memory_budget is not None and self.memory_budget < 1:
            raise ValueError(f"FoldConfig.chunk_size and memory_budget must be >= 1 or None; got {self.chunk_size}, "
                             f"{self.memory_budget}")


@register("fold", FoldConfig)
class FoldingModel(nn.Module):
    """forward(input_ids, attention_mask, position_ids, msa_features, msa_mask, coordinates=None,
    atom_mask=None, recycles=None) -> dict (see the module docstring)."""

    input_ids_unit = "residues"
    """What one element of `input_ids` is, for the trainer's throughput (residues per second)."""

    def __init__(self, config: FoldConfig) -> None:
        super().__init__()
        self.config = config
        e = config.evoformer
        self.msa_in = nn.Linear(MSA_FEATURES, e.msa_dim)
        self.target_to_msa = nn.Linear(ALPHABET_SIZE, e.msa_dim)
        self.target_to_pair_i, self.target_to_pair_j = nn.Linear(ALPHABET_SIZE, e.pair_dim), nn.Linear(ALPHABET_SIZE, e.pair_dim)
        self.relative_position = nn.Embedding(2 * config.relative_position_clip + 1, e.pair_dim)
        self.recycled_msa_norm, self.recycled_pair_norm = LayerNorm(e.msa_dim), LayerNorm(e.pair_dim)
        self.recycled_distance = nn.Embedding(config.recycle_bins, e.pair_dim)
        self.evoformer = Evoformer(e)
        self.single = nn.Linear(e.msa_dim, config.structure.single_dim)
        self.structure = StructureModule(config.structure, config.structure.single_dim, e.pair_dim)
        self.distogram_head = nn.Linear(e.pair_dim, config.distogram_bins)
        width = config.structure.single_dim
        self.training_step = 0
        self.plddt_head = nn.Sequential(LayerNorm(width), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                                        nn.ReLU(), nn.Linear(width, config.plddt_bins))
        self.secondary_structure_head = nn.Sequential(LayerNorm(width), nn.Linear(width, SECONDARY_STRUCTURE_STATES))
        self.profile_head = nn.Sequential(LayerNorm(e.msa_dim), nn.Linear(e.msa_dim, len(AMINO_ACIDS)))
        # Read by protein.fold on the realised fold, not by forward; fitted after training (protein.fit_confidence).
        self.burial = BurialNet(config.burial).requires_grad_(False)
        self.confidence_readout = ConfidenceReadout()

    PLAN_CROP = 256
    """Residues per crop in `example_batch` (AlphaFold's initial-training crop)."""
    PLAN_MSA_ROWS = 8
    """MSA rows per crop in `example_batch` (the training crops' default)."""

    @staticmethod
    def example_batch(config: FoldConfig, rows: int) -> dict[str, torch.Tensor]:
        """A training micro batch of `rows` random crops of PLAN_CROP residues L with a random
        profile sampled into PLAN_MSA_ROWS rows S: input_ids, position_ids (rows, L), msa_features
        (rows, S, L, MSA_FEATURES), msa_mask (rows, S, L), coordinates (rows, L, 5, 3) of a random walk
        with 3.8 Å between residues, atom_mask (rows, L, 5) all present, attention_mask (rows, L) of
        ones, random secondary_structure (rows, L) and the profile (rows, L, 20): what `zoo plan`
        estimates a step with."""
        length, depth = FoldingModel.PLAN_CROP, FoldingModel.PLAN_MSA_ROWS
        residues = torch.randint(0, len(AMINO_ACIDS), (rows, length))
        profiles = torch.rand(rows, length, len(AMINO_ACIDS)).softmax(-1)
        msa = [msa_features(r, p, depth) for r, p in zip(residues, profiles)]
        steps = torch.nn.functional.normalize(torch.randn(rows, length, 1, 3), dim=-1) * 3.8
        atoms = torch.randn(rows, length, 5, 3) * 1.5  # N, CA, C, O, CB about each residue
        return {"input_ids": residues, "position_ids": torch.arange(length).expand(rows, length).clone(),
                "msa_features": torch.stack([features for features, _ in msa]),
                "msa_mask": torch.stack([mask for _, mask in msa]), "coordinates": steps.cumsum(1) + atoms,
                "atom_mask": torch.ones(rows, length, 5, dtype=torch.bool), "attention_mask": torch.ones(rows, length),
                "secondary_structure": torch.randint(0, SECONDARY_STRUCTURE_STATES, (rows, length)), "profile": profiles}

    def parallel_plan(self) -> ModelPlan:
        """Each Evoformer block is one shard and recompute unit; under tensor parallelism the
        Evoformer runs with dynamic axial parallelism (MSA split by rows, pair by residues). A
        pipeline's first stage holds the input embeddings, its last the structure module, the heads,
        the burial network and the confidence readout.
        config.memory_budget sizes every chunk."""
        return ModelPlan(blocks=("evoformer.blocks.*",), axial=("evoformer",), pipeline=PipelineSplit(
            pre=("msa_in", "target_to_msa", "target_to_pair_i", "target_to_pair_j", "relative_position",
                 "recycled_msa_norm", "recycled_pair_norm", "recycled_distance"),
            post=("single", "structure", "distogram_head", "plddt_head", "secondary_structure_head", "profile_head",
                  "burial", "confidence_readout")), chunk_memory="memory_budget")

    def set_training_step(self, step: int) -> None:
        """Called by the trainer before each optimizer step: seeds the draw of the recycles."""
        self.training_step = step

    def chunk_size(self, length: int, rows: int, batch: int) -> int | None:
        """The Evoformer chunk size: config.chunk_size, or the slices whose largest intermediate
        (float32 attention logits of one row or column, or one row of outer products) fit
        config.memory_budget bytes."""
        c, e = self.config, self.config.evoformer
        if c.chunk_size is not None:
            return c.chunk_size
        per_slice = batch * 4 * max(e.pair_heads * length * length, e.msa_heads * max(length, rows) ** 2,
                                    length * e.outer_product_dim**2)
        return chunk_size_for(c.memory_budget, per_slice)

    def row_chunk_size(self, length: int, batch: int) -> int | None:
        """The chunk size along residues of IPA, the distogram loss and FAPE: config.chunk_size, or
        the rows whose largest intermediate (float32 distogram logits with their log-softmax, or
        IPA's per-head terms and pair rows) fit config.memory_budget bytes."""
        c, s = self.config, self.config.structure
        if c.chunk_size is not None:
            return c.chunk_size
        per_row = batch * 4 * length * max(2 * c.distogram_bins, 4 * s.heads + c.evoformer.pair_dim)
        return chunk_size_for(c.memory_budget, per_row)

    def _embed(self, input_ids, position_ids, msa_features):
        target = target_features(input_ids)
        msa = self.msa_in(msa_features) + self.target_to_msa(target)[:, None]
        pair = (self.target_to_pair_i(target)[:, :, None] + self.target_to_pair_j(target)[:, None]
                + self.relative_position(relative_positions(position_ids, self.config.relative_position_clip)))
        return msa, pair

    def _trunk_inputs(self, batch: dict, previous: dict) -> Carry:
        """What the Evoformer blocks read: {"msa" (B, S, L, Cm), "pair" (B, L, L, Cz) with the
        previous pass recycled in, "msa_mask" (B, S, L) and "pair_mask" (B, L, L) as floats}."""
        msa, pair = self._embed(batch["input_ids"], batch["position_ids"], batch["msa_features"])
        bins = distogram_targets(previous["ca"], self.config.recycle_bins, 3.375, 21.375)
        msa = torch.cat([msa[:, :1] + self.recycled_msa_norm(previous["msa_row"]).to(msa.dtype)[:, None], msa[:, 1:]], 1)
        pair = pair + self.recycled_pair_norm(previous["pair"]).to(pair.dtype) + self.recycled_distance(bins)
        mask = batch["attention_mask"].float()
        return {"msa": msa, "pair": pair, "msa_mask": batch["msa_mask"].float() * mask[:, None],
                "pair_mask": mask[:, :, None] * mask[:, None, :]}

    def _no_recycle(self, batch: dict) -> dict:
        """The recycled inputs of a first pass: zeros."""
        b, length = batch["input_ids"].shape
        device, e = batch["msa_features"].device, self.config.evoformer
        return {"msa_row": torch.zeros(b, length, e.msa_dim, device=device),
                "pair": torch.zeros(b, length, length, e.pair_dim, device=device),
                "ca": torch.zeros(b, length, 3, device=device)}

    def pipeline_enter(self, input_ids, attention_mask, position_ids, msa_features, msa_mask, coordinates=None,
                       atom_mask=None, secondary_structure=None, profile=None) -> Carry:
        """First pipeline stage: the Evoformer's inputs of a pass without recycling (see
        `_trunk_inputs`). Recycling runs every block once per recycle, so a pipelined model trains
        with FoldConfig.max_recycles = 0."""
        if self.config.max_recycles:
            raise ValueError("pipeline parallelism runs the folding model without recycling (each recycle would run "
                             f"every stage); set FoldConfig.max_recycles=0, got {self.config.max_recycles}")
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                 "msa_features": msa_features, "msa_mask": msa_mask}
        return self._trunk_inputs(batch, self._no_recycle(batch))

    def pipeline_block(self, block: nn.Module, carry: Carry) -> Carry:
        """One Evoformer block on the carry's MSA and pair representations."""
        b, rows, length = carry["msa"].shape[:3]
        msa, pair = block(carry["msa"], carry["pair"], carry["msa_mask"], carry["pair_mask"],
                          self.chunk_size(length, rows, b))
        return {**carry, "msa": msa, "pair": pair}

    def pipeline_exit(self, carry: Carry, input_ids, attention_mask, position_ids, msa_features, msa_mask,
                      coordinates=None, atom_mask=None, secondary_structure=None, profile=None) -> torch.Tensor:
        """Last pipeline stage: structure module, pLDDT head and the training loss."""
        if coordinates is None or atom_mask is None:
            raise ValueError("training the folding model needs coordinates and atom_mask in the batch")
        row_chunk = self.row_chunk_size(input_ids.shape[1], input_ids.shape[0])
        structure = self.structure(self.single(carry["msa"][:, 0]), carry["pair"], attention_mask.float(), row_chunk)
        targets = {"secondary_structure": secondary_structure, "profile": profile, "msa_features": msa_features}
        return self._losses(carry["pair"], carry["msa"][:, 0], structure, coordinates, atom_mask, attention_mask,
                            targets, row_chunk)["loss"]

    def _pass(self, batch: dict, previous: dict, chunk: int | None, row_chunk: int | None) -> dict:
        trunk = self._trunk_inputs(batch, previous)
        msa, pair = self.evoformer(trunk["msa"], trunk["pair"], trunk["msa_mask"], trunk["pair_mask"], chunk)
        structure = self.structure(self.single(msa[:, 0]), pair, batch["attention_mask"].float(), row_chunk)
        # The first row copied out: a view would keep the whole MSA of this pass alive through the next.
        return {"msa_row": msa[:, 0].clone(), "pair": pair, "ca": structure["backbone"][:, :, 1], "structure": structure}

    def forward(self, input_ids, attention_mask, position_ids, msa_features, msa_mask, coordinates=None,
                atom_mask=None, secondary_structure=None, profile=None, recycles: int | None = None
                ) -> dict[str, torch.Tensor]:
        c = self.config
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                 "msa_features": msa_features, "msa_mask": msa_mask}
        b, length = input_ids.shape
        if recycles is None and self.training:
            draw = torch.Generator().manual_seed(self.training_step)
            recycles = int(torch.randint(c.max_recycles + 1, (), generator=draw))
        elif recycles is None:
            recycles = c.max_recycles
        chunk, row_chunk = self.chunk_size(length, msa_features.shape[1], b), self.row_chunk_size(length, b)
        previous = self._no_recycle(batch)
        with torch.no_grad():
            for _ in range(recycles):
                passed = self._pass(batch, previous, chunk, row_chunk)
                previous = {k: v.detach() for k, v in passed.items() if k in previous}
        final = self._pass(batch, previous, chunk, row_chunk)
        structure = final["structure"]
        outputs = {"backbone": structure["backbone"], "plddt": plddt_from_logits(self.plddt_head(structure["single"])),
                   "secondary_structure_logits": self.secondary_structure_head(structure["single"]).float()}
        if coordinates is None:
            outputs["distogram_logits"] = distogram_logits(self.distogram_head, final["pair"])
        else:
            targets = {"secondary_structure": secondary_structure, "profile": profile, "msa_features": msa_features}
            outputs.update(self._losses(final["pair"], final["msa_row"], structure, coordinates, atom_mask,
                                        attention_mask, targets, row_chunk))
        return outputs

    def _losses(self, pair, query_row, structure, coordinates, atom_mask, attention_mask, targets, chunk) -> dict:
        """The weighted loss and its terms; query_row (B, L, Cm) is the MSA's first row, targets the
        optional "secondary_structure" and "profile" labels with the "msa_features" they go with."""
        c = self.config
        plddt_logits = self.plddt_head(structure["single"]).float()
        coordinates = coordinates.float()
        backbone_mask = atom_mask[..., :3].all(-1).float() * attention_mask.float()  # N, CA, C present
        true_frames = Frames.from_points(coordinates[..., 0, :], coordinates[..., 1, :], coordinates[..., 2, :])
        fapes = [fape(frames, true_frames, frames.translation, coordinates[..., 1, :], backbone_mask, backbone_mask,
                      c.fape_clamp, chunk_size=chunk) for frames in structure["frames"]]
        fape_loss = torch.stack(fapes).mean()
        has_cb = atom_mask[..., 4].bool()
        beta = torch.where(has_cb[..., None], coordinates[..., 4, :], coordinates[..., 1, :])
        beta_mask = (has_cb | atom_mask[..., 1].bool()).float() * attention_mask.float()
        disto = distogram_loss(self.distogram_head, pair, beta, beta_mask, chunk)
        confidence = plddt_loss(plddt_logits, structure["backbone"][:, :, 1], coordinates[..., 1, :], backbone_mask)
        loss = fape_loss + c.distogram_weight * disto + c.plddt_weight * confidence
        losses = {"fape": fape_loss.detach(), "distogram_loss": disto.detach(), "plddt_loss": confidence.detach()}
        if targets["secondary_structure"] is not None:
            states = targets["secondary_structure"].masked_fill(attention_mask == 0, IGNORE_INDEX)
            logits = self.secondary_structure_head(structure["single"]).float()
            states_loss = F.cross_entropy(logits.flatten(0, 1), states.flatten(), ignore_index=IGNORE_INDEX) \
                if (states != IGNORE_INDEX).any() else logits.sum() * 0.0
            loss = loss + c.secondary_structure_weight * states_loss
            losses["secondary_structure_loss"] = states_loss.detach()
        if targets["profile"] is not None:
            withheld = (targets["msa_features"][:, 0, :, -1] == 0).float() * attention_mask.float()  # (B, L)
            log_q = self.profile_head(query_row).float().log_softmax(-1)
            cross_entropy = -(targets["profile"].float() * log_q).sum(-1)
            profile_loss = (cross_entropy * withheld).sum() / withheld.sum().clamp_min(1.0)
            loss = loss + c.profile_weight * profile_loss
            losses["profile_loss"] = profile_loss.detach()
        return {"loss": loss, **losses}
