"""Transducer speech recognition (its models arrive with the asr issues)."""
