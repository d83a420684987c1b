"""Vision models on the fused layers (ViT arrives with the vision issue)."""
