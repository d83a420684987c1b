"""The imported Whisper tiny.en encoder against CTranslate2's own forward pass (float32, random
features of 600 and 3,000 frames), and our Whisper feature scaling against transformers'
WhisperFeatureExtractor: the relative errors BENCHMARKS quotes (`asr.whisper_parity`).

    python benchmarks/whisper_parity.py
"""

from __future__ import annotations

from asr.whisper_encoder import WhisperEncoder, packaged_whisper_tiny_en
from asr.whisper_parity import encoder_error, feature_scaling_error


def main() -> None:
    encoder = WhisperEncoder.from_ctranslate2(packaged_whisper_tiny_en())
    print("| comparison | relative error |\n|---|---|")
    for frames in (600, 3000):
        print(f"| encoder vs CTranslate2, {frames} frames | {encoder_error(encoder, frames):.2e} |")
    print(f"| feature scaling vs WhisperFeatureExtractor | {feature_scaling_error():.2e} |")


if __name__ == "__main__":
    main()
