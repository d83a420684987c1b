"""The `zoo train` and `zoo plan` verbs, registered as `memzoo.commands` entry points."""
