"""Vision models on the fused zoo.nn layers: ViT (`vision.vit`)."""
