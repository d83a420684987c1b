"""AlphaFold-style protein folding: residues and sequences (`protein.residues`), PDB/mmCIF
chains (`protein.pdb_io`), superposition (`protein.superposition`) and structure metrics
(`protein.metrics`)."""
