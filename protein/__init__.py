"""AlphaFold-style protein folding (arrives with the protein issue)."""
