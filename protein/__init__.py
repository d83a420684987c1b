"""AlphaFold-style protein folding: residues and sequences (`protein.residues`), PDB/mmCIF chains
(`protein.pdb_io`), the shipped ProMod3 chains (`protein.data`), model inputs (`protein.features`),
the Evoformer, structure module and model (`protein.evoformer`, `protein.structure_module`,
`protein.model`) with their precision and chunking rules (`protein.precision`, `protein.chunking`),
losses (`protein.losses`), metrics (`protein.metrics`), and `protein.fold(model_or_name, sequence)`."""

from protein.folding import fold

__all__ = ["fold"]
