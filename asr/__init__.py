"""Transducer speech recognition: log-mel features and SpecAugment (`asr.features`), the Conformer
encoder (`asr.conformer`), stateless decoder and joiner (`asr.decoder`), the model with its
selectable objective (`asr.model`), the RNN-T losses (`asr.losses`), greedy and modified beam
search (`asr.decoding`) with shallow fusion of a token n-gram model (`asr.language_model`) or a
word n-gram model spelled through its lexicon (`asr.word_language_model`), error
rates (`asr.wer`), synthesised and recorded speech (`asr.data`), and
`asr.transcribe(model_or_name, waveforms_or_files)`."""

from asr.transcription import transcribe

__all__ = ["transcribe"]
