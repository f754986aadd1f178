"""Several devices: layouts, their per-rank byte model, measured collectives, a real sharded forward.

    layout       Layout (tp, ep, dp_attention, pp) as data, validated against a model, and the
                 local shapes one rank holds
    cost         per-rank accounting: weight/KV bytes, FLOPs and every collective of a forward
    collectives  all-reduce / all-gather / reduce-scatter / all-to-all timed as nccl-tests
                 reports them (algbw, busbw) and fitted as latency + bytes / bandwidth
    launch       torch.distributed start-up: torch.multiprocessing spawn, torchrun or srun
    sharded      the compact decoder with column/row-parallel linears and experts split
    runner       the sweep across ranks: rank 0 times, the others follow in lockstep
    engines      engine profiles (roofline/data/engines.yaml) and the name of one
    kernels      kernel efficiencies per device and format (roofline/data/kernels.yaml)
    whatif       step time, layouts and capacity for a device from its datasheet row and the
                 sourced priors of roofline/data/priors.yaml (efficiencies, launch floors, links)
    anchors      published multi-GPU measurements beside our predictions
"""
