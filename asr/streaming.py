"""Streaming transcription with a chunk-wise transducer (`ConformerConfig.chunk_frames` > 0, or one
trained with dynamic chunks, which streams in chunks of any whole number of frames): audio arrives
piece by piece, and the tokens of each chunk are decoded as soon as the chunk, and the subsampling's
60 ms look-ahead, has been heard.

    stream = StreamingTranscriber(model, tokenizer, features, chunk_ms=320)
    for piece in pieces:                      # (N,) float waveforms at features.sample_rate
        for word in stream.accept(piece):     # the words completed by this piece
            print(word.text, word.emitted_at)
    stream.finish()                           # the rest; stream.text is the transcript
    stream.stream_recording(waveform)         # or: a whole recording, a chunk at a time, then finish

Each step encodes the log-mel features of the last `window_seconds` of audio (the window starting on
a chunk boundary) and keeps the encoder frames of the chunks completed since the step before. A
chunk-wise encoder's frame depends on no later input; rotary attention and convolutions are
shift-invariant; so when the window is longer than the encoder's receptive field (layers x
(left_chunks x chunk_frames + conv_kernel - 1) frames back) the frames are those of the whole
recording encoded at once. Greedy search goes on over the new frames (`asr.decoding.greedy_continue`).

The stream keeps only the audio a later window can read (at most `window_seconds`, a chunk and a
step), so a stream of any length holds bounded memory. The level (`FeatureConfig.level_dbfs`) is that
of the window: an automatic gain that follows the speaker, where offline transcription levels the
whole recording at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from asr.conformer import subsampled_lengths
from asr.decoding import GreedyState, greedy_continue
from asr.features import FeatureConfig, log_mel
from asr.model import Transducer
from asr.text import TranscriptTokenizer

SUBSAMPLING = 4
"""Feature frames per Conformer frame (two stride-2 convolutions)."""


@dataclass(frozen=True)
class EmittedWord:
    """A word of the transcript and when the stream gave it."""

    text: str
    emitted_at: float
    """Seconds of audio heard when the word was complete (its last token decoded and the next word begun,
    or the stream finished)."""
    decoded_at: float
    """Seconds of audio heard when its last token was decoded."""
    frame_time: float
    """Position in the audio of the encoder frame its last token was decoded at, in seconds."""


class StreamingTranscriber:
    """Greedy streaming transcription of one audio stream (see the module docstring)."""

    def __init__(self, model: Transducer, tokenizer: TranscriptTokenizer, features: FeatureConfig,
                 chunk_ms: int = 320, window_seconds: float = 20.0, max_symbols_per_frame: int = 3) -> None:
        encoder = model.config.encoder
        if model.config.encoder_kind != "conformer" or not (encoder.chunk_frames or encoder.dynamic_chunks):
            raise ValueError("streaming needs a chunk-wise Conformer transducer (trained with --model.encoder.chunk_frames "
                             "N or --model.encoder.dynamic_chunks N); this model encodes with full context")
        frame_ms = 1000 * SUBSAMPLING * encoder.frame_stack * features.hop_length / features.sample_rate
        if encoder.dynamic_chunks:  # any whole number of frames
            if chunk_ms < frame_ms or round(chunk_ms / frame_ms) * frame_ms != chunk_ms:
                raise ValueError(f"chunk_ms must be a multiple of the model's frame, {frame_ms:g} ms; got {chunk_ms}")
            model = model.with_chunk_frames(round(chunk_ms / frame_ms))
            encoder = model.config.encoder
        chunk_model_ms = frame_ms * encoder.chunk_frames
        if chunk_ms < 1 or round(chunk_ms / chunk_model_ms) * chunk_model_ms != chunk_ms:
            raise ValueError(f"chunk_ms must be a multiple of the model's chunk, {chunk_model_ms:g} ms "
                             f"({encoder.chunk_frames} frames of {frame_ms:g} ms); got {chunk_ms}")
        self.model, self.tokenizer, self.features = model.eval(), tokenizer, features
        self.frame_seconds = frame_ms / 1000
        self.step_samples = chunk_ms * features.sample_rate // 1000
        self.chunk_features = SUBSAMPLING * encoder.frame_stack * encoder.chunk_frames
        """Feature frames a chunk spans; windows start on a multiple of it."""
        self.window_features = math.ceil(window_seconds * features.sample_rate / features.hop_length)
        self.max_symbols = max_symbols_per_frame
        self.audio = torch.zeros(0)
        """The audio a later window may still read: samples from `dropped` on (up to the last decode)."""
        self.pending: list[torch.Tensor] = []
        """Pieces heard since the last decode, joined to `audio` at the next."""
        self.pending_samples = 0
        """Samples in `pending`."""
        self.dropped = 0
        """Samples heard before `audio` begins (a window starts on a chunk boundary and never moves back)."""
        self.fed = 0
        """Samples offered since the last step."""
        self.state = GreedyState.start(model, 1)
        self.words_out = 0
        self.next_token = 0
        """Index of the first token of the next word to emit."""
        self.decoded_at: list[float] = []
        """Seconds heard when each token of the hypothesis was decoded."""
        self.words: list[EmittedWord] = []

    @property
    def text(self) -> str:
        """The transcript so far."""
        return self.tokenizer.decode(self.state.hypotheses[0])

    @property
    def heard_samples(self) -> int:
        """Samples heard since the stream began."""
        return self.dropped + self.audio.numel() + self.pending_samples

    def accept(self, samples: torch.Tensor) -> list[EmittedWord]:
        """Hear samples (N,) (float, at features.sample_rate); returns the words they completed."""
        if samples.ndim != 1:
            raise ValueError(f"samples must be (N,); got shape {tuple(samples.shape)}")
        self.pending.append(samples.detach().float().cpu())
        self.pending_samples += samples.numel()
        self.fed += samples.numel()
        if self.fed >= self.step_samples:
            self.fed = 0
            self._decode(final=False)
        return self._new_words(final=False)

    def stream_recording(self, waveform: torch.Tensor) -> list[EmittedWord]:
        """Hear a whole recording (N,) a chunk (`step_samples`) at a time, as it would arrive live, and
        finish; returns every word it gave (`words`), with their delays as a live stream's."""
        for start in range(0, waveform.numel(), self.step_samples):
            self.accept(waveform[start : start + self.step_samples])
        self.finish()
        return self.words

    def finish(self) -> list[EmittedWord]:
        """The end of the stream: decode what is left; returns the words it completed."""
        self._decode(final=True)
        return self._new_words(final=True)

    @torch.no_grad()
    def _decode(self, final: bool) -> None:
        """Encode the window and decode the frames of newly completed chunks (every frame when final)."""
        if self.pending:
            self.audio = torch.cat([self.audio, *self.pending])
            self.pending, self.pending_samples = [], 0
        heard, hop, half_window = self.heard_samples, self.features.hop_length, self.features.n_fft // 2
        if heard <= half_window:
            return
        # Feature frames whose windows lie wholly in the audio heard (centred: frame i reads i*hop +- n_fft/2);
        # at the end, every frame, the last ones reflect-padded as offline.
        complete = (heard if final else heard - half_window) // hop + 1
        first = max(0, complete - self.window_features) // self.chunk_features * self.chunk_features
        # Later windows start at `first` or after it: the audio before it is never read again.
        self.audio = self.audio[first * hop - self.dropped :]
        self.dropped = first * hop
        waveform = self.audio
        feats, _ = log_mel(self.features.levelled(waveform), self.features)
        feats = feats[:, : complete - first]
        frames = int(subsampled_lengths(feats.shape[1], self.model.config.encoder.frame_stack))
        if frames < 1:
            return
        encoded, _ = self.model.encode(feats)
        offset = first // (SUBSAMPLING * self.model.config.encoder.frame_stack)  # the window's first encoder frame
        chunk = self.model.config.encoder.chunk_frames
        ready = offset + frames if final else (offset + frames) // chunk * chunk
        new = encoded[:, self.state.frames_done - offset : ready - offset]
        if new.shape[1] > 0:
            before = len(self.state.hypotheses[0])
            greedy_continue(self.model, new, torch.tensor([new.shape[1]]), self.state, self.max_symbols)
            self.decoded_at += [heard / self.features.sample_rate] * (len(self.state.hypotheses[0]) - before)

    def _new_words(self, final: bool) -> list[EmittedWord]:
        """Words completed since the last call: all but the last word of the text (which may go on), or
        every word at the end."""
        words = self.text.split()
        complete = len(words) if final else max(0, len(words) - 1)
        new = []
        heard = self.heard_samples / self.features.sample_rate
        for index in range(self.words_out, complete):
            last = self._last_token(words[index])
            new.append(EmittedWord(words[index], heard, self.decoded_at[last],
                                   self.state.frames[0][last] * self.frame_seconds))
        self.words_out = max(self.words_out, complete)
        self.words += new
        return new

    def _last_token(self, word: str) -> int:
        """Index in the hypothesis of the last token of `word`, the next word to emit: the first token
        from self.next_token on with which the decoded tokens read `word`."""
        tokens, start = self.state.hypotheses[0], self.next_token
        end = next((end for end in range(start, len(tokens))
                    if self.tokenizer.decode(tokens[start : end + 1]).split() == [word]), len(tokens) - 1)
        self.next_token = end + 1
        return end
