"""Ready-made training recipes, found by `zoo train NAME` through `memzoo.recipes` entry points."""
