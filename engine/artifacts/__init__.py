"""Model packaging, apart from the engine that runs a model:

    model_dir       a model directory: manifest of SHA-256 checksums, config, tokenizer, weights (ModelArtifacts)
    model_import    GGUF files and Hugging Face checkpoints turned into model directories
    demo_model      offline demo checkpoints (seeded corpus, tokenizer and weights) for fast tests
    golden          golden prompts: a version's own quality check, run greedily on the engine

Nothing is imported here: `engine.artifacts.golden` stays torch-free for the callers that need only it.
"""
