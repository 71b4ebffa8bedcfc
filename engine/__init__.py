"""ledgerlm inference engine: a library (no Kafka, no Postgres, no HTTP).

    engine.engine.Engine          add_request / abort / step / has_unfinished / stats
    engine.config.EngineConfig    memory, batching, reservation and tenant weights
    engine.request                EngineRequest, SamplingParams, RequestOutput, FinishReason
    engine.artifacts              model packaging: manifest-checked model directories (model_dir), GGUF and
                                  Hugging Face import (model_import), demo checkpoints (demo_model), golden
                                  prompts (golden)

Nothing is imported here so that `engine.request` stays cheap for callers
that only need the value types (torch loads with `engine.engine`).
"""
