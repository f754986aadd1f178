"""roofline: memory-bandwidth roofline benchmarking for LLM inference.

Where things live (one subpackage per part of the pipeline; data flows top to bottom):

    model/        what a forward pass is: shapes (config), presets, the compact decoder,
                  RoPE, and the byte/FLOP model of that exact code (accounting), the cost card
    checkpoints/  Hugging Face folders: safetensors loader, tensor inventory, chat prompts
    measure/      how it is timed: the one timer, Triton kernels, ceilings, telemetry,
                  the device datasheet table and device names, the resumable sweep
    io/           what is written: the results schema and run folders, provenance
    analysis/     what the numbers mean: cost-model fit, predictions, capacity planning
    spec/         speculative decoding: theory (tau, speedup, k*), the verification rules,
                  the engine and its drafters, validation against the cost model,
                  acceptance measured on real prompts, vLLM metrics
    report/       pictures and the Markdown/HTML report of a run folder

The library never imports Hydra; experiments/ turns a composed config into the frozen
dataclasses these modules take.
"""
