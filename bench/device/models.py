"""The models the device bench runs: the real one (SmolLM2 when imported, else a demo model) and a random-weight
Llama-3-8B-shaped one built in memory.

The random model is a `ModelArtifacts` handed to `Engine(artifacts=...)`: no file, no download. Its tensors are
made on first read and not kept (`LazyRandomTensors`), so the engine's fused QKV and gate/up copies are the only
copies on the device (16 GB of bf16 weights, not 25).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

SMOLLM2_VERSION = "smollm2-135m-instruct@1"


@dataclass(frozen=True)
class Shape:
    """A Llama-family shape (what `ModelDims` needs), named for the report."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


LLAMA3_8B = Shape("llama3-8b-shape", 32, 4096, 32, 8, 14336, 128256, 8192)
# The same proportions at 1/8 of the width, depth and vocabulary (head_dim 128 and GQA 4:1 kept): ~30M parameters,
# a CPU steps it in milliseconds.
LLAMA3_8B_EIGHTH = Shape("llama3-8b-shape/8", 4, 512, 4, 1, 1792, 16032, 2048)


@dataclass(frozen=True)
class RealModel:
    """The model directory the real-model sections run, and why that one."""

    model_dir: Path
    name: str
    note: str


def resolve_real_model(home: Path, quick: bool, model_dir: Path | None = None) -> RealModel:
    """`model_dir` if given; else SmolLM2 when `ledgerlm models pull smollm2-135m-instruct` imported it under
    `home`; else a demo model (tiny when quick, small otherwise), built once under `home/models`."""
    if model_dir is not None:
        return RealModel(Path(model_dir), Path(model_dir).name, "given with --model-dir")
    smollm2 = home / "models" / SMOLLM2_VERSION
    if not quick and (smollm2 / "manifest.json").is_file():
        return RealModel(smollm2, SMOLLM2_VERSION, "imported by `ledgerlm models pull smollm2-135m-instruct`")
    size = "tiny" if quick else "small"
    demo = home / "models" / f"device-demo-{size}"
    why = "quick mode" if quick else f"SmolLM2 absent ({smollm2} has no manifest)"
    if not (demo / "manifest.json").is_file():
        from engine.artifacts.demo_model import build_demo_model

        # Untrained (train_steps=0) for the small one: a minute of CPU training buys nothing a GPU bench needs.
        build_demo_model(demo, size=size, train_steps=None if quick else 0, progress=False)
    return RealModel(demo, f"demo-{size}", f"{why}: the {size} demo model")


class NullTokenizer:
    """What the engine asks of a tokenizer, for a model with no vocabulary: decoding yields no text."""

    eos_token_id = None
    backend_tokenizer = None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


class LazyRandomTensors(dict):
    """name -> tensor of a Llama checkpoint, drawn (N(0, 0.02); norms 1) when read and not kept."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype, device, seed: int = 0) -> None:
        super().__init__((name, None) for name in shapes)
        self.shapes, self.dtype, self.device = shapes, dtype, device
        import torch

        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __getitem__(self, name: str):
        import torch

        shape = self.shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(shape, dtype=self.dtype, device=self.device)
        return torch.empty(shape, dtype=self.dtype, device=self.device).normal_(0, 0.02, generator=self.generator)


def checkpoint_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    shapes = {"model.embed_tokens.weight": (shape.vocab_size, h), "model.norm.weight": (h,),
              "lm_head.weight": (shape.vocab_size, h)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (shape.intermediate_size, h),
                       p + "mlp.up_proj.weight": (shape.intermediate_size, h),
                       p + "mlp.down_proj.weight": (h, shape.intermediate_size)})
    return shapes


def random_artifacts(shape: Shape, dtype, device):
    """`ModelArtifacts` of `shape` with random weights made on `device` in `dtype` (Llama-3's RoPE theta)."""
    import torch

    from engine.artifacts.model_dir import ModelArtifacts
    from engine.llama import ModelDims

    dims = ModelDims(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                     intermediate_size=shape.intermediate_size, num_layers=shape.num_layers,
                     num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                     rms_norm_eps=1e-5, max_position_embeddings=shape.max_position_embeddings, qkv_bias=False,
                     tie_word_embeddings=False, qk_norm=False)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim))
    tensors = LazyRandomTensors(checkpoint_shapes(shape), dtype, device)
    checksums = {"random": f"{shape.name}:{asdict(shape)}"}
    return ModelArtifacts(Path(f"<random {shape.name}>"), checksums, config=None, tokenizer=NullTokenizer(),
                          dims=dims, tensors=tensors, inv_freq=inv_freq, attention_scaling=1.0, sliding_window=None)


def weight_bytes_read_per_step(engine) -> int:
    """Bytes of weights one decode step reads: every layer's matrices and norms, the final norm and the LM head
    (of the embedding only the batch's rows, left out)."""
    w = engine.runner.model.w
    tensors = [t for layer in w.layers for t in layer.values() if t is not None] + [w.norm, w.lm_head]
    return sum(t.numel() * t.element_size() for t in tensors)
