"""Several devices: layouts, their per-rank byte model, measured collectives, a real sharded forward.

    layout       Layout (tp, ep, dp_attention, pp) as data, validated against a model, and the
                 local shapes one rank holds
    cost         per-rank accounting: weight/KV bytes, FLOPs and every collective of a forward
    collectives  all-reduce / all-gather / reduce-scatter / all-to-all timed as nccl-tests
                 reports them (algbw, busbw) and fitted as latency + bytes / bandwidth
    launch       torch.distributed start-up: torch.multiprocessing spawn, torchrun or srun
    sharded      the compact decoder with column/row-parallel linears and experts split
    runner       the sweep across ranks: rank 0 times, the others follow in lockstep
    priors       sourced priors (efficiencies, launch floors, links) for devices never measured
    whatif       step time, layouts and capacity for a device from its datasheet row + priors
    anchors      published multi-GPU measurements beside our predictions
"""
