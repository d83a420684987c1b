"""The model card of a recogniser the `asr_transducer` recipe trained (or evaluated anew): what it is,
what it was trained on, how it decodes, its word error rates on every held-out set and on each real
recording, and its memory per rank."""

from __future__ import annotations

import dataclasses
from typing import Any

from asr.accents import VOICE_FOLDER
from asr.data import CorpusConfig
from asr.kokoro import BLEND
from asr.model import Transducer
from asr.training_text import HELD_OUT_SOURCE, LANGUAGE_MODEL_SOURCE_CREDITS
from asr.voices import HELD_OUT_ACCENT, HELD_OUT_VARIANTS
from recipes.asr_transducer_config import ASRTransducerConfig

RECORDED = ("librivox", "cards")
"""The sets of real recordings (`asr.data.recorded_speech`), reported one utterance at a time."""


def model_card(name: str, model: Transducer, config: ASRTransducerConfig, metrics: dict[str, Any], memory: str,
               world_size: int, command: str, training_voices: list[str]) -> str:
    """The card (markdown) of the recogniser `model` saved as `name`: `metrics` as `evaluate_and_save`
    measured them, `memory` the trainer's table, `command` the run's command line, `training_voices`
    the names of the voices that spoke the training split."""
    rescored = bool(metrics.get("rescoring", {}).get("weight"))
    rows = "\n".join(f"| {n} | {metrics[n]['utterances']} | {metrics[n]['greedy_wer']:.4f} | {metrics[n]['beam_wer']:.4f} | "
                     f"{metrics[n]['lm_wer']:.4f} | {metrics[n]['lm_cer']:.4f} |"
                     + (f" {metrics[n]['rescored_wer']:.4f} |" if rescored else "") for n in metrics['sizes'] if n != "train")
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    return f"""# {name}

A transducer speech recogniser: {_encoder_words(config, model)},
stateless decoder, joiner, {model.config.vocab_size} {config.tokens} tokens; {parameters:.1f} M parameters. Trained with the
{model.config.loss} loss on {metrics['sizes']['train']:,} utterances ({metrics['train_hours']} hours) synthesised from
{_text_words(config.corpus)}, spoken by {voices_words(training_voices)}, speeds 140-200 wpm, pitches 30-70.

- {_made_by(config, metrics, command, world_size)}
- Decoding: modified beam search, beam {config.beam}, fused with {_language_model_words(config)} of the
  {'training transcripts' if config.lm_text == 'transcripts' else 'training text'}{_lm_source_words(config)} (`language_model.safetensors`, weight {metrics['lm_weight']}{_tuning_words(metrics)}, less the internal
  language model at weight {config.ilm_weight}; `--lm-weight 0` turns it off){_lexicon_words(metrics)}.{_rescoring_words(metrics)}{_lm_source_notices(config)}
- Held out: sentences never trained on (test_sentences, training voices), spoken again by speakers never trained on
  (test_voices: the variants {', '.join(HELD_OUT_VARIANTS)} in the training accents) and in an accent never trained on
  (test_accent: {HELD_OUT_ACCENT}, West Midlands, training variants).{_domain_words(config.corpus)} Real speech: Debian `pocketsphinx-testdata`
  (LibriVox, card names), recorded by people: the gap from synthetic training speech to it is large.

| set | utterances | WER greedy | WER beam {config.beam} | WER beam + LM | CER beam + LM |{' WER + Whisper rescoring |' if rescored else ''}
|---|---|---|---|---|---|{'---|' if rescored else ''}
{rows}

The real recordings one by one (beam search with the language model{', rescored' if rescored else ''}):

{_recorded_rows(metrics)}

## Memory per rank (measured in training step 2)

{memory}

Use it with `zoo transcribe {name} FILE.wav ...` or `asr.transcribe("{name}", paths)` in Python.
"""


def _made_by(config: ASRTransducerConfig, metrics: dict[str, Any], command: str, world_size: int) -> str:
    trained = (f"{metrics['train_seconds']} s of training, {_head_words(config)}{metrics['steps']} steps of the whole model, "
               f"{metrics['utterances_seen']:,} utterances seen")
    if config.evaluate_only:
        return (f"Made by: `{config.init}`'s training ({trained}; its card says how), evaluated and its decoding "
                f"chosen anew by `{command}`")
    return f"Made by: `{command}` ({world_size} rank(s), strategy {dataclasses.asdict(config.strategy)}; {trained})"


def _lm_source_words(config: ASRTransducerConfig) -> str:
    return "".join(f" and {LANGUAGE_MODEL_SOURCE_CREDITS[source][0]}" for source in config.lm_sources)


def _lm_source_notices(config: ASRTransducerConfig) -> str:
    return "".join(f"\n- The language model counts {words}: {notice}." for words, notice in
                   (LANGUAGE_MODEL_SOURCE_CREDITS[source] for source in config.lm_sources))


def _rescoring_words(metrics: dict[str, Any]) -> str:
    tried, chosen = metrics.get("rescoring_validation_wer"), metrics.get("rescoring", {})
    if not tried:
        return ""
    choice = f"{_tried_words(tried)} at weight,bonus[,transcript: Whisper's own transcript among the hypotheses]"
    if not chosen["weight"]:
        return f" No second pass (chosen on {_tuning_protocol(metrics)}: WER {choice})."
    transcript = " and Whisper's own greedy transcript (scored by the transducer as the beam's are)" if chosen.get(
        "whisper_transcript") else ""
    return (f" Second pass: the final beam{transcript} rescored by Whisper tiny.en's own encoder and decoder "
            f"(`asr.whisper_rescoring`; its log probability at weight {chosen['weight']}, a bonus of {chosen['token_bonus']} "
            f"a Whisper token; chosen on {_tuning_protocol(metrics)}: WER {choice}).")


def _lexicon_words(metrics: dict[str, Any]) -> str:
    tried = metrics["lexicon_penalty_validation_wer"]
    if not tried:
        return ""
    choice = _tried_words(tried)
    if not metrics["lexicon_penalty"]:
        return f"; no lexicon penalty (chosen on {_tuning_protocol(metrics)}: WER {choice})"
    return (f"; a word finished outside the lexicon (`lexicon.txt`, {metrics['lexicon_words']:,} words: Debian wamerican's "
            f"and the language model's text's, `asr.lexicon`) costs {metrics['lexicon_penalty']} x the language-model weight "
            f"(chosen on {_tuning_protocol(metrics)}: WER {choice})")


def voices_words(names: list[str]) -> str:
    """The espeak-ng accents and variants of the voices `names` ("accent+variant"), and flite's and
    Kokoro's voices ("flite+voice", "kokoro+voice"; Kokoro's blends of two counted), for the card."""
    titles = {"flite": "flite", "kokoro": "Kokoro"}
    others = {title: sorted({n.split("+")[1] for n in names if n.startswith(f"{synthesiser}+")})
              for synthesiser, title in titles.items()}
    espeak = [n for n in names if n.split("+")[0] not in titles]
    accents, variants = {n.split("+")[0] for n in espeak}, {n.split("+")[1] for n in espeak}
    synthetic = sum(a.startswith(f"{VOICE_FOLDER}/") for a in accents)
    return (f"{len(accents)} espeak-ng accents{f' ({synthetic} of them synthetic)' if synthetic else ''} x {len(variants)} "
            f"variants" + "".join(f" and {title}'s {_listed(voices)}" for title, voices in others.items() if voices))


def _listed(voices: list[str]) -> str:
    """"a, b" of the voices, then "and N blends of two of them" for those named "a~b"."""
    plain, blends = [v for v in voices if BLEND not in v], [v for v in voices if BLEND in v]
    words = [", ".join(plain)] if plain else []
    if blends:
        words.append(f"{len(blends)} blends of two {'of them' if plain else 'voices'}")
    return " and ".join(words)


def _head_words(config: ASRTransducerConfig) -> str:
    if not config.head_steps:
        return ""
    return (f"first {config.head_steps} steps of the decoder and joiner on the frozen encoder's outputs "
            f"({config.head_views} encoded passes over the training set, `asr.encoder_cache`), then ")


def _encoder_words(config: ASRTransducerConfig, model: Transducer) -> str:
    shape = f"{model.config.encoder.layers} blocks of width {model.config.encoder.width}"
    if config.encoder == "whisper-tiny.en":
        return f"Whisper encoder ({shape}), started from Whisper tiny.en's (MIT) and fine-tuned"
    return f"Conformer encoder ({shape})"


def _text_words(corpus: CorpusConfig) -> str:
    if corpus.text == "modern":
        return ("the sentences of six text sources in spoken form (`asr.training_text`: Shakespeare, Debian fortunes, "
                "the Python documentation's prose, movie reviews, tweets and New York Times editorials)")
    return "Shakespeare sentences (public domain)"


def _domain_words(corpus: CorpusConfig) -> str:
    if corpus.text != "modern":
        return ""
    unseen_kokoro = (" The validation sentences are also spoken by Kokoro speakers never trained on "
                     "(validation_kokoro: even blends of three of its voices).") if corpus.kokoro_share else ""
    return (f" A text source never trained on, spoken by unseen speakers (test_domain: {HELD_OUT_SOURCE}, "
            "Amazon product reviews), and the same sentences spoken by a synthesiser never trained on "
            f"(test_synthesiser: piper's neural voice joe).{unseen_kokoro}")


def _recorded_rows(metrics: dict[str, Any]) -> str:
    lines = ["| set | reference | hypothesis | WER |", "|---|---|---|---|"]
    lines += [f"| {name} | {u['reference']} | {u['hypothesis']} | {u['wer']:.3f} |"
              for name in RECORDED for u in metrics[name]["per_utterance"]]
    return "\n".join(lines)


def _tuning_words(metrics: dict[str, Any]) -> str:
    tried = metrics["lm_weight_validation_wer"]
    if not tried:
        return ""
    return f" chosen on {_tuning_protocol(metrics)} (WER {_tried_words(tried)})"


def _tried_words(tried: dict[str, float]) -> str:
    """{setting: WER} as the card lists what tuning tried: "0.1500 at 0.2, 0.1400 at 0.4"."""
    return ", ".join(f"{rate:.4f} at {setting}" for setting, rate in tried.items())


def _tuning_protocol(metrics: dict[str, Any]) -> str:
    """How the decoding was chosen (`ASRTransducerConfig.lm_tuning`, tuning_sets and their utterances),
    in the card's words."""
    count, sets = metrics.get("tuning_utterances", 0), metrics.get("tuning_sets", ["validation"])
    where = "validation" if sets == ["validation"] else " and ".join(sets)
    if count:
        where = f"{count} validation utterances" if sets == ["validation"] else f"{count} utterances of {where}"
    if metrics.get("lm_tuning", "validation") == "validation":
        return where
    return f"{where}, leaving each utterance's own text source out of the language model's and lexicon's text"


def _language_model_words(config: ASRTransducerConfig) -> str:
    if not config.lm_order:
        return "no language model"
    if config.lm_unit == "word":
        return f"the word {config.lm_order}-gram language model (spelled through the lexicon)"
    return f"the {config.lm_order}-gram {config.tokens} language model"
