"""Transducer speech recognition: the RNN-T losses (`asr.losses`); models, features and decoding
arrive with the end-to-end ASR issue."""
