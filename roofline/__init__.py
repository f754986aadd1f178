"""roofline: memory-bandwidth roofline benchmarking for LLM inference.

Where things live (one subpackage per part of the pipeline; data flows top to bottom):

    model/        what a forward pass is: shapes (config), presets, the dtype vocabulary (dtypes),
                  number formats per tensor class (formats) and quantised linears (quant), the
                  KV cache in its format (kvcache), the compact decoder, RoPE, the byte/FLOP
                  model of that exact code (accounting), the formulas of speculative decoding
                  (speculation: tau, R, S, k*)
    checkpoints/  Hugging Face folders: safetensors loader, tensor inventory, chat prompts
    measure/      how it is timed: the one timer, Triton kernels, ceilings, telemetry, busy-machine
                  detection (noise), the device datasheet table and device strings (devices),
                  resident memory (memory), the resumable sweep, layer-sliced extrapolation
    io/           what is written: the results schema and run folders, provenance, strict
                  dict -> dataclass (fields), atomic writes (files)
    parallel/     several devices: layouts, per-rank accounting, collectives, the sharded
                  forward and its launcher, what-if pricing from priors, published anchors
    analysis/     what the numbers mean: roofline physics (roofs), cost-model fit and its step
                  table, predictions, capacity planning
    spec/         speculative decoding on top of its formulas (model/speculation): the verification rules,
                  acceptance counters, the engine and its drafters, validation against the
                  cost model, acceptance measured on real prompts, vLLM metrics
    report/       figures (making and saving), pictures of a run, report sections (cost model,
                  speculative decoding), the Markdown/HTML report
    train/        the small MTP model, its tokenizer and draft model, trained on the CPU
    commands/     one module per command (sweep, fit, predict, card, ...): the plain config dict
                  -> the request -> the run -> files, console text and JSON summary

The library never imports Hydra; roofline/cli/ composes the config (Hydra) and calls
roofline.commands. Each floor imports only the floors below it (docs/design.md, tests/test_layering.py).
"""
