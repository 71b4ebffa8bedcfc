"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over the paged KV pool.

RMSNorm, RoPE (theta and scaling from the config via transformers' RoPE
tables), grouped-query attention, SwiGLU, optional QKV bias, optional
per-head RMSNorm of q and k before RoPE (Qwen3). Tokens of all
sequences in a step are packed into one flat batch (no padding): decode rows
first, then prefill chunks. Projections run once over the whole batch;
only attention is split by sequence (engine.attention).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import AttentionPath


@dataclass(frozen=True)
class ModelDims:
    """The numbers of a checkpoint that shape tensors."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    qkv_bias: bool
    tie_word_embeddings: bool
    qk_norm: bool  # RMSNorm over each head's head_dim of q and k, before RoPE

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class ForwardBatch:
    """Tensors for one packed forward. See `ModelRunner.prepare`."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] where each token's key/value is written
    attention: object  # the attention path's plan for this step (engine.attention)
    logits_indices: torch.Tensor  # [S] rows whose next-token logits are needed


class LlamaWeights:
    """Weights in the layout the forward wants: fused QKV and gate/up projections."""

    def __init__(self, dims: ModelDims, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
        def take(name: str) -> torch.Tensor:
            return tensors[name].to(device=device, dtype=dtype).contiguous()

        def maybe(name: str) -> torch.Tensor | None:
            # Llama's attention_bias also puts a bias on o_proj; mlp_bias on the MLP.
            return take(name) if name in tensors else None

        def fused_bias(names: list[str], weights: list[torch.Tensor]) -> torch.Tensor | None:
            biases = [maybe(n) for n in names]
            if all(b is None for b in biases):
                return None
            return torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])

        self.embed = take("model.embed_tokens.weight")
        self.norm = take("model.norm.weight")
        self.lm_head = self.embed if dims.tie_word_embeddings or "lm_head.weight" not in tensors else take("lm_head.weight")
        self.layers = []
        for i in range(dims.num_layers):
            p = f"model.layers.{i}."
            qkv_w = [take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            gate_up_w = [take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
            self.layers.append(
                dict(
                    in_norm=take(p + "input_layernorm.weight"),
                    qkv=torch.cat(qkv_w),
                    qkv_bias=fused_bias([p + f"self_attn.{n}_proj.bias" for n in "qkv"], qkv_w),
                    q_norm=take(p + "self_attn.q_norm.weight") if dims.qk_norm else None,
                    k_norm=take(p + "self_attn.k_norm.weight") if dims.qk_norm else None,
                    o=take(p + "self_attn.o_proj.weight"),
                    o_bias=maybe(p + "self_attn.o_proj.bias"),
                    post_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat(gate_up_w),
                    gate_up_bias=fused_bias([p + f"mlp.{n}_proj.bias" for n in ("gate", "up")], gate_up_w),
                    down=take(p + "mlp.down_proj.weight"),
                    down_bias=maybe(p + "mlp.down_proj.bias"),
                )
            )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as transformers (float32 statistics) so greedy parity holds.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaModel:
    """Stateless forward over a `ForwardBatch`; the KV pool is passed in."""

    def __init__(self, dims: ModelDims, weights: LlamaWeights, inv_freq: torch.Tensor, attention_scaling: float,
                 attention: AttentionPath):
        self.dims = dims
        self.w = weights
        self.attention = attention
        dtype, device = weights.embed.dtype, weights.embed.device
        positions = torch.arange(dims.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * attention_scaling).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * attention_scaling).to(device=device, dtype=dtype)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_pool: torch.Tensor) -> torch.Tensor:
        d = self.dims
        x = self.w.embed[batch.input_ids]
        cos = self.cos[batch.positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin[batch.positions].unsqueeze(1)
        for i, layer in enumerate(self.w.layers):
            h = rms_norm(x, layer["in_norm"], d.rms_norm_eps)
            qkv = F.linear(h, layer["qkv"], layer["qkv_bias"])
            q, k, v = qkv.split([d.q_size, d.kv_size, d.kv_size], dim=-1)
            q = q.view(-1, d.num_heads, d.head_dim)
            k = k.view(-1, d.num_kv_heads, d.head_dim)
            v = v.view(-1, d.num_kv_heads, d.head_dim)
            if d.qk_norm:
                q = rms_norm(q, layer["q_norm"], d.rms_norm_eps)
                k = rms_norm(k, layer["k_norm"], d.rms_norm_eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k_pool, v_pool = kv_pool[i, 0], kv_pool[i, 1]  # [KVH, slots, D]
            k_pool.index_copy_(1, batch.slot_mapping, k.transpose(0, 1))
            v_pool.index_copy_(1, batch.slot_mapping, v.transpose(0, 1))
            attn = self.attention.attend(batch.attention, q, k, v, k_pool, v_pool)
            x = x + F.linear(attn, layer["o"], layer["o_bias"])
            h = rms_norm(x, layer["post_norm"], d.rms_norm_eps)
            gate, up = F.linear(h, layer["gate_up"], layer["gate_up_bias"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down"], layer["down_bias"])
        x = rms_norm(x[batch.logits_indices], self.w.norm, d.rms_norm_eps)
        return F.linear(x, self.w.lm_head).float()
