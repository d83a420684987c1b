"""zoo.nn: the fused layers every zoo model is built from, each saving as few tensors as its
backward needs. PyTorch paths run everywhere; Triton kernels join them on GPUs (`zoo.nn.backend`)."""

from zoo.nn.activation import bias_act_dropout
from zoo.nn.attention import SelfAttention, attention
from zoo.nn.block import TransformerBlock, TransformerBlockConfig, block_plan
from zoo.nn.cross_attention import CrossAttention
from zoo.nn.cross_entropy import linear_cross_entropy
from zoo.nn.decoder_block import DecoderBlock, decoder_block_plan
from zoo.nn.dropout import dropout
from zoo.nn.embedding import Embeddings
from zoo.nn.kv_cache import KVCache
from zoo.nn.mlp import FusedMLP, fused_mlp
from zoo.nn.moe import MoEConfig, MoEFeedForward
from zoo.nn.norm import Norm, dropout_add, dropout_add_norm, layer_norm, rms_norm

__all__ = [
    "CrossAttention", "DecoderBlock", "Embeddings", "FusedMLP", "KVCache", "MoEConfig", "MoEFeedForward", "Norm", "SelfAttention", "TransformerBlock", "TransformerBlockConfig", "attention",
    "bias_act_dropout", "block_plan", "decoder_block_plan", "dropout", "dropout_add", "dropout_add_norm", "fused_mlp", "layer_norm",
    "linear_cross_entropy", "rms_norm",
]
