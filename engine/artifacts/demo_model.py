"""Offline demo checkpoints: generated corpus, byte-level BPE tokenizer, Llama weights.

Everything derives from one seed and needs no network, so two builds with the
same arguments produce the same tokenizer and the same initial weights.
"""
from __future__ import annotations

import math
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.artifacts.model_dir import write_manifest

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|eos|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class DemoSize:
    """Shape of a demo model and of the data it is built from."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    corpus_chars: int
    train_seq_len: int
    train_batch: int
    learning_rate: float
    default_train_steps: int


SIZES = {
    # 0.16M parameters, 512-token vocabulary: builds in seconds inside a test session.
    "tiny": DemoSize(512, 64, 176, 2, 4, 2, 512, 150_000, 64, 8, 3e-3, 10),
    # 30.9M parameters, 8,192-token vocabulary, GQA 8:2: the benchmark model (~1 min to build).
    "small": DemoSize(8192, 512, 1408, 8, 8, 2, 2048, 3_000_000, 128, 8, 1e-3, 30),
    # 4.9M parameters, 4,096-token vocabulary, an 8,192-token context: the serving bench's model (long documents
    # of 4,600 tokens; light enough that a 2-core CPU serves several requests a second, ~20 s to build).
    "mini": DemoSize(4096, 256, 704, 4, 8, 2, 8192, 1_000_000, 128, 8, 2e-3, 20),
}

_WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had not but what "
    "all were when we there can an your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who now people "
    "my made over did down only way find use may water long little very after words called just where most know"
).split()
_UNICODE = ("café", "naïve", "über", "smörgåsbord", "東京", "データ", "привет", "λόγος", "😀", "🚀", "€", "±", "→")
_SYLLABLES = "ka lo mi ne su ra ti po ve da shi zu ber tan mor qui len fa gor pel vin tro sal ux ith".split()


def generate_corpus(num_chars: int, seed: int) -> list[str]:
    """Deterministic pseudo-English lines: common words, invented words drawn
    Zipf-like (so BPE has merges to learn), numbers, Unicode, chat turns."""
    rng = random.Random(seed)
    invented = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(6000)})
    rng.shuffle(invented)
    zipf = [1.0 / (i + 1) for i in range(len(invented))]
    lines: list[str] = []
    size = 0
    while size < num_chars:
        words = []
        for _ in range(rng.randint(4, 18)):
            r = rng.random()
            if r < 0.55:
                words.append(rng.choice(_WORDS))
            elif r < 0.93:
                words.append(rng.choices(invented, weights=zipf)[0])
            elif r < 0.98:
                words.append(str(rng.randint(0, 10 ** rng.randint(1, 5))))
            else:
                words.append(rng.choice(_UNICODE))
        sentence = " ".join(words).capitalize() + rng.choice(".!?;,")
        if rng.random() < 0.2:
            sentence = f"<|user|>{sentence}<|eos|><|assistant|>{' '.join(rng.sample(words, len(words)))}.<|eos|>"
        lines.append(sentence)
        size += len(sentence) + 1
    return lines


def train_tokenizer(lines: list[str], vocab_size: int):
    """Byte-level BPE wrapped as a transformers fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_demo_model(
    out_dir: str | Path,
    size: str = "tiny",
    train_steps: int | None = None,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = lambda msg: None,
    max_context: int | None = None,
) -> Path:
    """Build a complete, manifest-checked model directory at `out_dir` (must not exist or be empty).

    `max_context` overrides the size's context length (`max_position_embeddings`); RoPE has no learned
    positions, so the same weights serve a longer context (the serving bench's long documents need 4,600).

    Files are written to a temporary sibling and renamed into place, so a
    crash never leaves a half-built directory that looks valid.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = SIZES[size]
    if max_context is not None and max_context < 1:
        raise ValueError(f"max_context must be >= 1, got {max_context}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    steps = spec.default_train_steps if train_steps is None else train_steps

    lines = generate_corpus(spec.corpus_chars, seed)
    tokenizer = train_tokenizer(lines, spec.vocab_size)
    log(f"tokenizer: {len(tokenizer)} tokens from {len(lines)} lines")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=max_context or spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    if steps > 0:
        _train(model, tokenizer, lines, spec, steps, seed, progress)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp)
        tmp.chmod(0o755)  # mkdtemp creates 0700
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _train(model, tokenizer, lines: list[str], spec: DemoSize, steps: int, seed: int, progress: bool) -> None:
    """A few AdamW steps on random windows of the corpus: enough that the text is not pure noise."""
    import torch
    from tqdm import tqdm

    ids = torch.tensor(tokenizer("\n".join(lines))["input_ids"], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    bar = tqdm(range(steps), desc="train", disable=not progress, unit="step")
    for _ in bar:
        starts = torch.randint(0, len(ids) - spec.train_seq_len, (spec.train_batch,), generator=gen)
        batch = torch.stack([ids[s : s + spec.train_seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
