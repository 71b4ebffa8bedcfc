"""Bounds on what one request may ask of the engine (README, "Bad input").

The gateway refuses values outside them with a 400 naming the field; `Engine.add_request` checks them
again (`engine.checks`). Only numbers: torch-free, and below `engine.request` (whose greedy test needs
MIN_TEMPERATURE), so the gateway and the request types can import them.
"""
from __future__ import annotations

# Below this temperature a request is greedy, not an error: dividing float32 logits by less can overflow
# them to inf, and the distribution is one-hot to float32 precision long before (vLLM draws the same line).
MIN_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes [0, 2**64)
MAX_LOGPROBS = 20  # alternatives per position (OpenAI's top_logprobs, vLLM's max_logprobs)
MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| (OpenAI's range)
MAX_REPETITION_PENALTY = 10.0  # (0, 10]: 1 is neutral; beyond this every seen token is as good as banned
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0  # |bias|, OpenAI's range: +-100 bans or forces a token
MAX_STRUCTURED_CHARS = 64 * 1024  # a JSON schema, regex, grammar or choice list travels in every StartAttempt
