"""the cost card of a preset or checkpoint

`python -m roofline.cli.card model=llama-3.1-8b dtype=bf16` (or `checkpoint=DIR`): what one forward
of a preset must move, and the floor that implies. With a device, the what-if ITL of that step; with
`input_len=` and `output_len=` too, a finite benchmark run priced as `vllm bench serve` measures it (TTFT,
ITL median / p90, TPOT, end-to-end latency, output tok/s and per GPU, the sequences the engine keeps running).

Decode at small batch is bandwidth-bound: each step streams every active weight (and the
KV cache) from memory once, so no step can be faster than bytes / bandwidth. The card states
those bytes, the floor on a chosen device's datasheet bandwidth, and the ridge point
(FLOP per byte) above which the same step would be compute-bound instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roofline.io import files
from roofline.model.accounting import (forward_cost, kv_bytes_per_token, kv_split_token_bytes,
                                       linear_state_bytes_per_seq, param_count, resident_weight_bytes)
from roofline.model.presets import get_preset
from roofline.model.formats import QUALITY_NOTE, parse_precision, precision_columns
from roofline.io.fields import ConfigError, internal, option
from roofline.model.config import ModelConfig
from roofline.commands import (CheckpointKeys, FormatKeys, GraphKeys, LayoutKeys, priced_weights, served_label,
                               target_model)
from roofline.measure.devices import Datasheet, get_datasheet
from roofline.analysis.calibrate import POINTS_FILE
from roofline.analysis.fitcheck import check_drafter
from roofline.parallel.engines import check_client, engine_name, graph_batch_sizes, profile, run_scheduling
from roofline.parallel.whatif import (EAGLE3_DRAFT_VOCAB, WHATIF_DRAFTERS, SpecDecode, check_draft_vocab, check_tree,
                                      matmul_dtype, random_dataset_lengths)
from roofline.parallel.whatif import launch_kind as engine_launch_kind


# what the `device` entry (roofline/conf/device/) means to this command: the datasheet row priced
DEVICE_AS = "datasheet"


@dataclass(frozen=True)
class CardRequest:
    """One cost card: a model at a precision, priced at one (batch, context) on a datasheet row."""

    model: ModelConfig = option(help="model preset (roofline/conf/model/)")
    dtype: str = option("bfloat16", "float32 | bfloat16 | float16 (or fp32 | bf16 | fp16): activations (and every "
                                    "class not overridden); the request takes a precision label "
                                    "(roofline.model.formats)")
    device: Datasheet | None = internal(None, "the command's `device` key (a roofline/conf/device/ entry): its "
                                              "datasheet row")
    batch: int = option(1, "sequences per decode step")
    context: int = option(0, "tokens already in each sequence's KV cache")
    engine: str | None = option(None, "with a device: the what-if ITL of this step with an engine profile "
                                      "(roofline/conf/engine/); null: the span of the profiles")
    tp: int = internal(1, "the what-if layout of the ITL line: the tp key (roofline.commands.LayoutKeys)")
    ep: int = internal(1, "the what-if layout of the ITL line: the ep key (roofline.commands.LayoutKeys)")
    dp_attention: bool = internal(False, "the what-if layout of the ITL line: the dp_attention key "
                                         "(roofline.commands.LayoutKeys)")
    input_len: int = option(0, "with a device and output_len: price a finite run as `vllm bench serve` measures it "
                               "(roofline.parallel.whatif.serve): prompt tokens per request")
    output_len: int = option(0, "the finite run's output tokens per request")
    concurrency: int = option(0, "the finite run's requests in flight (0: batch); with request_rate: the client's "
                                 "--max-concurrency (0: none)")
    num_prompts: int = option(0, "the finite run's requests in all (0: concurrency; with request_rate: 1000, bench "
                                 "serve's default)")
    request_rate: float = option(0.0, "the finite run's requests a second, arriving as vllm bench serve --request-rate "
                                      "sends them (roofline.parallel.whatif.serve_at_rate: in flight by Little's law, "
                                      "queued past the engine's cap); 0: every request at once (inf)")
    staggered: bool = option(False, "the finite run's lengths vary (requests finish one by one and their "
                                    "replacements' prompts ride in the decode steps); false: fixed lengths")
    range_ratio: float = option(1.0, "the finite run's lengths as a random dataset draws them (vllm bench serve "
                                     "--random-range-ratio r: each request's input and output uniform in [r·L, L]); "
                                     "< 1 prices their means with staggered requests; 1: fixed lengths")
    client: str = option("server", "how the finite run reaches the engine: server (its HTTP server, as `vllm bench "
                                   "serve`) or offline (its offline entry point: vLLM's benchmark_throughput / "
                                   "benchmark_latency, the LLM class); picks the engine's default tokens per step and "
                                   "running-sequence cap (engines.yaml prefill_chunk_tokens, max_running_seqs)")
    prefill_chunk_tokens: int = option(0, "the finite run's prompt tokens per step (its --max-num-batched-tokens, "
                                          "chunked_prefill_size or max_num_tokens; 0: the engine's default)")
    max_running_seqs: int = option(0, "the finite run's cap on running sequences (its --max-num-seqs, "
                                      "--max-running-requests or max_batch_size; 0: the engine's default, SGLang's 48 "
                                      "when it speculates)")
    step_batching: str = option("", "how the finite run's prompt chunks share its steps: shared | prefill_first | "
                                    "beside (empty: the engine's; vLLM V0 with --enable-chunked-prefill: shared)")
    graph_batch_sizes: tuple | None = internal(None, "the graph_batch_sizes key (roofline.commands.GraphKeys), checked")
    calibrate: str | None = option(None, f"with a device: {POINTS_FILE}: the what-if rescaled to them, its "
                                         "decode-step interval narrowed where they determine it "
                                         "(roofline.analysis.calibrate)")
    k: int = option(0, "the finite run with speculative decoding: k drafts per round (0: plain decoding); priced "
                       "beside the same run without it")
    acceptance: float | tuple | None = option(None, "with k: the drafts' conditional acceptance, one rate or k rates "
                                                    "(position 1..k), each in [0, 1]; yours to give (measure it with "
                                                    "roofline.cli.acceptance or read vLLM's spec-decode metrics)")
    drafter: str = option("mtp", "with k: mtp (the model's MTP modules) | eagle | eagle3 (an EAGLE-1/2 or EAGLE-3 head "
                                 "over the target's hidden states) | draft_model | ngram")
    draft_vocab: int | None = option(None, "with drafter=eagle3: the head's draft vocabulary (its draft_vocab_size; "
                                           f"unset: {EAGLE3_DRAFT_VOCAB}, the released heads')")
    draft_topk: int = option(1, "with an MTP or EAGLE head: a draft tree's width, the tokens a sequence drafts in each "
                                "pass after the first (SGLang's --speculative-eagle-topk; 1: a chain)")
    draft_tokens: int | None = option(None, "with a draft tree: the tokens a sequence verifies a round (SGLang's "
                                            "--speculative-num-draft-tokens; unset: k + 1)")
    draft_model: ModelConfig | None = option(None, "with drafter=draft_model: the draft model's preset (replicated on "
                                                   "every rank, in the target's precision)")

    def __post_init__(self) -> None:
        parse_precision(self.dtype)
        for name in ("input_len", "output_len", "concurrency", "num_prompts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name}={v!r}: must be an integer >= 0")
        check_client(self.client)
        self.scheduling()  # the run's own scheduler keys, checked by name
        random_dataset_lengths(self.input_len, self.output_len, self.range_ratio)  # the ratio's range, by name
        rate = self.request_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
            raise ConfigError(f"request_rate={rate!r}: allowed a number of requests a second >= 0 (0: every request "
                              "at once)")
        if rate and not self.input_len:
            raise ConfigError(f"request_rate={rate!r} prices a finite run: give input_len= and output_len= too")
        if rate and self.client == "offline":
            raise ConfigError(f"request_rate={rate!r} with client=offline: an offline entry point takes every request "
                              "at once; a rate is a server's client (client=server)")
        if bool(self.input_len) != bool(self.output_len):
            raise ConfigError(f"input_len={self.input_len}, output_len={self.output_len}: a finite run needs both "
                              "(or neither)")
        if not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigError(f"batch={self.batch!r}: must be an integer >= 1")
        if not isinstance(self.context, int) or not 0 <= self.context < self.model.max_context:
            raise ConfigError(f"context={self.context!r}: must be in 0..{self.model.max_context - 1} (model.max_context)")
        self._check_spec()
        if self.input_len + self.output_len > self.model.max_context:
            raise ConfigError(f"input_len={self.input_len}, output_len={self.output_len}: a request of "
                              f"{self.input_len + self.output_len} tokens exceeds the model's max_context "
                              f"{self.model.max_context}")

    def scheduling(self) -> dict:
        """The finite run's own scheduler settings as serve's keyword arguments (engines.run_scheduling; empty: the
        engine's)."""
        return run_scheduling(dict(prefill_chunk_tokens=self.prefill_chunk_tokens, step_batching=self.step_batching,
                                   max_running_seqs=self.max_running_seqs), "")

    def _check_spec(self) -> None:
        """k, acceptance, drafter and draft_model: a speculative finite run's, each named where it is wrong."""
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ConfigError(f"k={self.k!r}: must be an integer >= 0 (0: plain decoding)")
        if self.drafter not in WHATIF_DRAFTERS:
            raise ConfigError(f"drafter={self.drafter!r}: allowed {', '.join(WHATIF_DRAFTERS)}")
        check_drafter(self.drafter, self.draft_model.name if self.draft_model else None)
        if self.draft_vocab is not None:
            check_draft_vocab(self.draft_vocab)
            if self.drafter != "eagle3":
                raise ConfigError(f"draft_vocab={self.draft_vocab!r} is given with drafter={self.drafter!r}: it prices "
                                  "only an EAGLE-3 head's LM head; drop draft_vocab or set drafter=eagle3")
        if not self.k:
            if self.acceptance is not None:
                raise ConfigError(f"acceptance={self.acceptance!r} is given with k=0: it prices only speculative "
                                  "decoding; give k= (drafts per round) or drop acceptance")
            if self.draft_topk != 1 or self.draft_tokens is not None:
                raise ConfigError(f"draft_topk={self.draft_topk!r}, draft_tokens={self.draft_tokens!r} are given with "
                                  "k=0: a draft tree prices only speculative decoding; give k= or drop them")
            return
        if not self.input_len:
            raise ConfigError(f"k={self.k}: speculative decoding is priced in a finite run; give input_len= and "
                              "output_len= (and concurrency=)")
        if self.acceptance is None:
            raise ConfigError(f"k={self.k}: acceptance= is needed (one rate or {self.k} per-position rates in "
                              "[0, 1]); it is the workload's, not the model's: measure it with roofline.cli.acceptance")
        if self.drafter == "mtp" and self.model.mtp_layers < 1:
            raise ConfigError(f"drafter=mtp: model {self.model.name!r} has no MTP module; use drafter=ngram or "
                              "drafter=draft_model with draft_model=<preset>")
        if self.drafter == "draft_model" and self.draft_model is None:
            raise ConfigError("drafter=draft_model needs draft_model=<preset> (the draft model's preset name)")
        check_tree(self.k, self.draft_topk, self.draft_tokens, self.drafter)
        self._acceptance()

    def _acceptance(self) -> tuple:
        """The acceptance as a tuple of rates: one, or one per draft position."""
        acc = self.acceptance
        acc = (acc,) if isinstance(acc, (int, float)) and not isinstance(acc, bool) else acc
        if (not isinstance(acc, (list, tuple)) or len(acc) not in (1, self.k)
                or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in acc)):
            raise ConfigError(f"acceptance={self.acceptance!r}: allowed one rate or k={self.k} rates (position 1..k), "
                              "each in [0, 1]")
        return tuple(float(a) for a in acc)

    def spec_decode(self, draft) -> SpecDecode | None:
        """The run's speculative decoding (roofline.parallel.whatif.SpecDecode; `draft` the draft model's WhatIf for
        drafter=draft_model), None for plain decoding."""
        if not self.k:
            return None
        return SpecDecode(self.k, self._acceptance(), self.drafter, draft, self.draft_vocab or EAGLE3_DRAFT_VOCAB,
                          self.draft_topk, self.draft_tokens)


@dataclass(frozen=True)
class CardKeys:
    """The keys that are not fields of the request: the device entry."""

    device: dict | None = option(None, "the datasheet row of the decode floor (roofline/conf/device/; cuda: the "
                                       "running GPU's); device=null for none")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (CardRequest, FormatKeys, CardKeys, CheckpointKeys, LayoutKeys, GraphKeys)


def rel_diff(ours: float, published: float) -> float | None:
    return None if not published else ours / published - 1.0


def card_record(req: CardRequest) -> dict:
    cfg, dtype = req.model, parse_precision(req.dtype).label
    pc = param_count(cfg)
    step = forward_cost(cfg, dtype, 1, 1, 0)
    at = forward_cost(cfg, dtype, req.batch, 1, req.context)
    rec = dict(
        model=cfg.name, dtype=dtype, layers=cfg.layers, attention=cfg.attention,
        experts=cfg.experts, experts_per_token=cfg.experts_per_token, mtp_layers=cfg.mtp_layers,
        params_total=pc.total, params_active=pc.active, params_mtp=pc.mtp,
        params_total_with_mtp=pc.total_with_mtp,
        published_params_total=cfg.published_params_total or None,
        published_params_active=cfg.published_params_active or None,
        rel_diff_total=rel_diff(pc.total, cfg.published_params_total),
        rel_diff_active=rel_diff(pc.active, cfg.published_params_active),
        published_note=cfg.published_note or None,
        weight_bytes=step.weight_bytes, kv_bytes_per_token=kv_bytes_per_token(cfg, dtype),
        local_kind=cfg.local_kind, local_span=cfg.local_span or None, windowed_layers=cfg.windowed_layers,
        index_topk=cfg.index_topk or None, linear_layers=cfg.linear_layers or None,
        linear_state_bytes_per_seq=linear_state_bytes_per_seq(cfg, dtype) or None,
        index_key_bytes_per_token=cfg.layers * kv_split_token_bytes(cfg, parse_precision(dtype))[1] or None,
        **precision_columns(dtype), native_weights=cfg.native_weights or None,
        resident_weight_bytes=resident_weight_bytes(cfg, dtype, with_mtp=False),
        resident_weight_bytes_with_mtp=resident_weight_bytes(cfg, dtype, with_mtp=True),
        quality_note=None if _as_released(cfg, dtype) else QUALITY_NOTE,
        batch=req.batch, context=req.context,
        step_bytes=at.bytes_total, step_flops=at.flops, step_intensity=at.intensity,
    )
    dev = req.device
    if dev is not None and dev.bandwidth_Bps():
        floor = at.bytes_total / dev.bandwidth_Bps()
        rec.update(device=dev.key, device_bw_GBps=dev.mem_bw_GBps, decode_floor_s=floor,
                   decode_ceiling_tok_s=req.batch / floor,
                   ridge_dtype=matmul_dtype(dev, parse_precision(dtype), "weights",  # mxfp4: the named engine's MMA
                                            profile(req.engine, 1).mxfp4_activations if req.engine else "bf16"))
        rec["ridge_flop_per_byte"] = dev.ridge(rec["ridge_dtype"])
    if dev is not None and dev.mem_bytes:
        rec.update(_fit_on(cfg, dtype, dev, req.batch, max(req.context, 1), req.engine))
    if dev is not None and dev.bandwidth_Bps() and dev.kind == "gpu":
        w = _what_if(req, dtype)  # one what-if (its calibration read once) for the ITL line and the finite run
        rec.update(_what_if_itl(req, w))
        if req.input_len:
            rec.update(_what_if_run(req, w))
    return rec


RUN_METRICS = (("ttft_s", "ttft_ms", 1e3), ("itl_s", "itl_median_ms", 1e3), ("itl_p90_s", "itl_p90_ms", 1e3),
               ("itl_mean_s", "tpot_ms", 1e3), ("e2e_s", "e2e_latency_s", 1.0), ("output_tok_s", "output_tok_s", 1.0),
               ("tok_s_per_gpu", "output_tok_s_per_gpu", 1.0), ("running", "running_seqs", 1.0),
               ("prefill_chunk_tokens", "prefill_chunk_tokens", 1.0))


def _what_if_run(req: CardRequest, w) -> dict:
    """A finite benchmark run priced by the what-if `w` (roofline.parallel.whatif.serve): each metric an interval.
    With speculative decoding (k > 0) the same run without it too, and the typical speedup of its rates."""
    from roofline.parallel.whatif import BENCH_SERVE_NUM_PROMPTS, serve, serve_at_rate
    I, O, drawn = random_dataset_lengths(req.input_len, req.output_len, req.range_ratio)
    if req.request_rate:  # arrivals at a rate: staggered by nature, concurrency the client's cap
        C, N, staggered = req.concurrency or None, req.num_prompts or BENCH_SERVE_NUM_PROMPTS, True
        run = lambda spec: serve_at_rate(w, I, O, req.request_rate, N, C, spec=spec, client=req.client,  # noqa: E731
                                         **req.scheduling())
    else:
        C = req.concurrency or req.batch
        N, staggered = req.num_prompts or C, req.staggered or drawn
        run = lambda spec: serve(w, I, O, C, N, staggered=staggered, client=req.client, spec=spec,  # noqa: E731
                                 **req.scheduling())
    spec = req.spec_decode(_draft_what_if(req, w))
    s = run(spec)
    out = dict(run_input_len=req.input_len, run_output_len=req.output_len, run_range_ratio=req.range_ratio,
               run_mean_input_len=I, run_mean_output_len=O, run_concurrency=C, run_num_prompts=N,
               run_staggered=staggered, run_client=req.client, run_max_running_seqs=req.max_running_seqs or None,
               run_request_rate=req.request_rate or None)
    if req.request_rate:
        out.update({f"run_{k}{end}": s[k][name] for k in ("in_flight", "queue_wait_s")
                    for end, name in (("", "typical"), ("_optimistic", "optimistic"), ("_pessimistic", "pessimistic"))})
    full = [e for e in w.setting.engine_names()
            if w.max_running(e, req.input_len + req.output_len, req.input_len + req.output_len // 2, spec) == 0]
    if full:
        out["run_note"] = (f"does not fit: on {w.layout.label()} the weights leave {', '.join(full)}'s KV pool (the "
                           "memory, where the engine states none) no room " + ("beside the drafter " if spec else "")
                           + f"for one sequence of {req.input_len + req.output_len} tokens (priced one at a time); "
                           "give more devices (tp=) or a smaller format (weights=)")
    for key, name, f in RUN_METRICS:
        iv = s[key]
        out.update({f"run_{name}": iv["typical"] * f, f"run_{name}_optimistic": iv["optimistic"] * f,
                    f"run_{name}_pessimistic": iv["pessimistic"] * f})
    if spec is not None:
        plain = run(None)
        out.update(run_spec_k=spec.k, run_spec_drafter=spec.drafter, run_spec_acceptance=list(spec.acceptance),
                   run_spec_draft_model=req.draft_model.name if req.draft_model else None,
                   run_spec_draft_vocab=spec.draft_vocab if spec.drafter == "eagle3" else None,
                   run_spec_draft_topk=spec.width, run_spec_verify_tokens=spec.verify_tokens or spec.k + 1,
                   run_spec_tokens_per_round=spec.tau(), run_plain_output_tok_s=plain["output_tok_s"]["typical"],
                   run_plain_tpot_ms=plain["itl_mean_s"]["typical"] * 1e3,
                   run_plain_e2e_latency_s=plain["e2e_s"]["typical"],
                   run_plain_running_seqs=plain["running"]["typical"],
                   run_spec_speedup=s["output_tok_s"]["typical"] / plain["output_tok_s"]["typical"],
                   run_spec_round_unmeasured=[e for e in w.setting.engine_names() if spec.drafter != "ngram"
                                              and profile(e, 1, w.setting.engines_path()).spec_round_s is None])
    return out


def _draft_what_if(req: CardRequest, w):
    """The draft model's what-if (drafter=draft_model), as the speculative what-if prices it
    (`WhatIf.draft_what_if`); None for another drafter."""
    return w.draft_what_if(req.draft_model) if req.k and req.drafter == "draft_model" else None


def _what_if(req: CardRequest, dtype: str):
    """The request's what-if (roofline.parallel.whatif.WhatIf): its model, device, precision, layout, engine."""
    from roofline.parallel.layout import Layout
    from roofline.parallel.whatif import Setting, WhatIf
    w = WhatIf(req.model, req.device, dtype, Layout(tp=req.tp, ep=req.ep, dp_attention=req.dp_attention),
               Setting(engine=req.engine, graph_batch_sizes=req.graph_batch_sizes))
    if req.calibrate:
        from roofline.analysis.calibrate import calibrated
        w = calibrated(w, req.calibrate)
    return w


def _what_if_itl(req: CardRequest, w) -> dict:
    """The decode step's ITL from the what-if `w` (roofline.parallel.whatif), an interval."""
    from roofline.parallel.whatif import memory_check, unfit_note
    from roofline.analysis import calibrate
    itl = w.itl(req.batch, req.context)
    out = dict(whatif_layout=w.layout.label(), whatif_engine=req.engine or "all profiles (span)",
               whatif_itl_ms=itl["typical"] * 1e3, whatif_itl_ms_optimistic=itl["optimistic"] * 1e3,
               whatif_itl_ms_pessimistic=itl["pessimistic"] * 1e3,
               whatif_experts_touched=w.experts_touched(req.batch))
    if req.engine:  # where the typical step's time goes (with no engine named the span has no one breakdown)
        out["whatif_terms_ms"] = {k: v * 1e3 for k, v in w.step_terms(req.batch, req.context, req.engine).items()}
        out["whatif_launch"] = launch_kind(profile(req.engine, 1), w.setting, moe=w.cfg.experts > 0)
    if w.calibration is not None:
        out["whatif_calibration"] = calibrate.summary(w)
    mem = memory_check(w.cfg, w.device, w.dtype, w.layout, req.batch, max(req.context, 1), setting=w.setting)
    if not mem["fits"]:
        out["whatif_note"] = unfit_note(w.layout.label(), mem)
    return out


def _fit_on(cfg: ModelConfig, dtype: str, dev: Datasheet, batch: int, tokens: int, engine: str | None) -> dict:
    """Per-GPU memory of the smallest layout whose shard fits (roofline.parallel.whatif.memory_check: the
    engine's KV pool, every profile's when none is named)."""
    from roofline.parallel.layout import Layout
    from roofline.parallel.whatif import Setting, memory_check, smallest_layout
    setting = Setting(engine=engine) if dev.kind == "gpu" else None
    lay = smallest_layout(cfg, dev, dtype, batch, tokens, setting=setting)
    if lay is None:
        mem = memory_check(cfg, dev, dtype, Layout(), batch, tokens, setting=setting)
        return dict(smallest_layout=None, device_mem_GB=mem["device_mem_GB"], memory_rule=mem["memory_rule"])
    mem = memory_check(cfg, dev, dtype, lay, batch, tokens, setting=setting)
    return dict(smallest_layout=lay.label(), layout_devices=lay.devices, per_gpu_weights_GB=mem["weights_GB"],
                per_gpu_kv_GB=mem["kv_GB"], device_mem_GB=mem["device_mem_GB"], memory_rule=mem["memory_rule"])


def _si(x: float, unit: str) -> str:
    for f, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= f:
            return f"{x / f:.3g} {p}{unit}"
    return f"{x:.3g} {unit}"


def _spread_floor(rec: dict) -> str:
    """The floor line's note where the model needs several devices: the one-device floor is the whole step's
    bytes over one device's bandwidth, and over the n devices of the smallest layout a step takes at least 1/n
    of it (bytes a layout replicates, norms or an MLA cache, only add to the busiest device)."""
    n = rec.get("layout_devices") or 1
    if n <= 1:
        return ""
    return (f"; on one device, which it does not fit: over the {n} of {rec['smallest_layout']} at least "
            f"{1e3 * rec['decode_floor_s'] / n:.3f} ms/step")


# what each term of the what-if's step (roofline.parallel.whatif.pass_seconds) prices, as the card names it
TERM_NAMES = dict(dense="dense GEMMs", experts="routed experts", elementwise="norms/activations/rotary",
                  attention="attention", kv_copy="KV cache copies", lm_head="LM head", per_layer="launch floors",
                  step_overhead="engine host time", per_seq="per-sequence device time", comm="collectives",
                  prefill_host="eager host time")
# what the launch term holds, by how the engine launches its kernels (launch_kind)
LAUNCH_NAMES = dict(graph="launch floors (CUDA graphs: the GPU's gaps between kernels)",
                    graph_moe="launch floors (CUDA graphs: the GPU's gaps between kernels, the MoE routing kernels)",
                    host_issue="launch floors (eager: host issue the GPU does not hide)",
                    engine_floor="launch floors (eager: the engine's own per-layer floor)")


def launch_kind(eng, setting, moe: bool = False) -> str:
    """The card's name (LAUNCH_NAMES) for what pass_seconds' launch term holds for engine `eng` under `setting`:
    roofline.parallel.whatif.launch_kind's answer, `graph_moe` for a graph engine's MoE model (its routing kernels
    in the term too)."""
    k = engine_launch_kind(eng, setting)
    return "graph_moe" if k == "graph" and moe else k


def _terms_line(terms_ms: dict, launch: str | None = None) -> str:
    """The typical step's terms, largest first, each in ms and as a share of the step (zero terms left out); the
    launch term named by what it holds (`launch`: launch_kind's answer)."""
    names = dict(TERM_NAMES, **({"per_layer": LAUNCH_NAMES[launch]} if launch else {}))
    total = sum(terms_ms.values())
    parts = sorted(((v, k) for k, v in terms_ms.items() if v > 0), reverse=True)
    return ", ".join(f"{names.get(k, k)} {v:.3g} ms ({100 * v / total:.0f}%)" for v, k in parts)


NOTE_DIFF = 0.05  # a published count this far from ours: the card prints the preset's note on how it counts


def render_card(rec: dict) -> str:
    pct = lambda v: "n/a" if v is None else f"{100 * v:+.2f}%"
    pub = lambda v: "n/a" if not v else _si(v, "")
    lines = [
        f"== cost card: {rec['model']} ({rec['dtype']}) ==",
        f"layers {rec['layers']}, attention {rec['attention']}, experts {rec['experts']} (top-{rec['experts_per_token']}), MTP modules {rec['mtp_layers']}",
        f"params total   {_si(rec['params_total'], '')}  (published {pub(rec['published_params_total'])}, diff {pct(rec['rel_diff_total'])})",
        f"params active  {_si(rec['params_active'], '')}  per token (published {pub(rec['published_params_active'])}, diff {pct(rec['rel_diff_active'])})",
        *([f"published      {rec['published_note']}"] if rec.get("published_note") and any(
            v is not None and abs(v) >= NOTE_DIFF for v in (rec["rel_diff_total"], rec["rel_diff_active"])) else []),
        f"params MTP     {_si(rec['params_mtp'], '')}  (own weights; embedding and LM head shared)",
        f"weight bytes   {_si(rec['weight_bytes'], 'B')} read per decode step (B=1, q=1; LM head in, embedding table out)",
        f"weights held   {_si(rec['resident_weight_bytes'], 'B')} (main model, embedding included; "
        f"{_si(rec['resident_weight_bytes_with_mtp'], 'B')} with MTP), scales and zero points included"
        + (f"; released as {rec['native_weights']}" if rec['native_weights'] else ""),
        f"KV cache       {_si(rec['kv_bytes_per_token'], 'B')} per token (all layers)"
        + (f"; {rec['windowed_layers']} of them attend only {rec['local_span']} tokens ({rec['local_kind']})"
           if rec.get("local_kind") else "")
        + (f"; {_si(rec['index_key_bytes_per_token'], 'B')} of it the sparse-attention indexer's keys, which a decode "
           f"step reads at every position; it attends only the {rec['index_topk']} tokens they rank best"
           if rec.get("index_topk") else "")
        + (f"; {rec['linear_layers']} of the {rec['layers']} layers are linear attention (Gated DeltaNet), which hold "
           f"no tokens but {_si(rec['linear_state_bytes_per_seq'], 'B')} of state per sequence, read and written "
           "back every step" if rec.get("linear_layers") else ""),
        f"decode step at B={rec['batch']}, L={rec['context']}: {_si(rec['step_bytes'], 'B')} moved, "
        f"{_si(rec['step_flops'], 'FLOP')}, intensity {rec['step_intensity']:.2f} FLOP/B",
    ]
    if "device" in rec:
        ridge = rec["ridge_flop_per_byte"]
        lines += [
            f"on {rec['device']} datasheet ({rec['device_bw_GBps']:.0f} GB/s): floor {1e3 * rec['decode_floor_s']:.3f} ms/step, "
            f"ceiling {rec['decode_ceiling_tok_s']:.0f} tok/s (B={rec['batch']})" + _spread_floor(rec),
            f"ridge point    {ridge:.0f} FLOP/B ({rec['ridge_dtype']} matmuls); this step is "
            f"{'memory' if rec['step_intensity'] < ridge else 'compute'}-bound" if ridge else "ridge point    n/a (no datasheet FLOP/s for this dtype)",
        ]
    if rec.get("smallest_layout"):
        lines.append(f"fits on {rec['layout_devices']} x {rec['device']} as {rec['smallest_layout']}: per GPU "
                     f"{rec['per_gpu_weights_GB']:.1f} GB weights + {rec['per_gpu_kv_GB']:.2f} GB KV "
                     f"(B={rec['batch']}, L={max(rec['context'], 1)}) of {rec['device_mem_GB']:.1f} GB "
                     f"({rec['memory_rule']})")
    elif "smallest_layout" in rec:
        lines.append(f"does not fit on up to 64 x {rec['device']} ({rec['device_mem_GB']:.1f} GB each, "
                     f"{rec['memory_rule']})")
    if "whatif_itl_ms" in rec:
        lines.append(f"what-if ITL    {rec['whatif_itl_ms']:.3f} ms ({rec['whatif_itl_ms_optimistic']:.3f}-"
                     f"{rec['whatif_itl_ms_pessimistic']:.3f}) at B={rec['batch']}, L={rec['context']} as "
                     f"{rec['whatif_layout']}, engine {rec['whatif_engine']}"
                     + (f", {rec['whatif_experts_touched']:.1f} experts touched per MoE layer" if req_moe(rec) else ""))
        if rec.get("whatif_terms_ms"):
            lines.append("  by term       " + _terms_line(rec["whatif_terms_ms"], rec.get("whatif_launch")))
        if rec.get("whatif_calibration"):
            cal = rec["whatif_calibration"]
            lines.append(f"  calibrated: x{cal['scale']:.3g} overall, interval at the points "
                         f"{cal['interval_at_points'][0]:.3g}-{cal['interval_at_points'][1]:.3g} of typical "
                         f"(B {cal['B_range'][0]:g}-{cal['B_range'][1]:g}, L {cal['L_range'][0]:g}-{cal['L_range'][1]:g})")
        if rec.get("whatif_note"):
            lines.append(f"  {rec['whatif_note']}")
    if "run_ttft_ms" in rec:
        drawn = (f" (random, range ratio {rec['run_range_ratio']:g}: {rec['run_mean_input_len']} / "
                 f"{rec['run_mean_output_len']} on average)" if rec["run_range_ratio"] < 1 else "")
        rate = rec.get("run_request_rate")
        steps = (f"{rec['run_client']} client, up to {rec['run_prefill_chunk_tokens']:.0f} prompt tokens a step"
                 + (" over its attention-DP ranks" if "dpattn" in str(rec.get("whatif_layout", "")) else ""))
        if rate:
            client_cap = bool(rec["run_concurrency"]) and rec["run_in_flight"] >= rec["run_concurrency"]
            where = " in the client (not in its TTFT: timed from when it is sent)" if client_cap else ""
            lines.append(f"finite run     {rec['run_num_prompts']} requests of {rec['run_input_len']} in / "
                         f"{rec['run_output_len']} out{drawn}, arriving {rate:g} a second (Poisson), "
                         + (f"at most {rec['run_concurrency']} at a time (the client's), " if rec['run_concurrency']
                            else "")
                         + f"{rec['run_in_flight']:.0f} in flight ({rec['run_in_flight_optimistic']:.0f}-"
                         f"{rec['run_in_flight_pessimistic']:.0f}; Little's law, within the engine's KV pool and "
                         f"sequence cap), the median request waiting {rec['run_queue_wait_s']:.3g} s for a slot"
                         f"{where}, {steps}")
        else:
            lines.append(f"finite run     {rec['run_num_prompts']} requests of {rec['run_input_len']} in / "
                         f"{rec['run_output_len']} out{drawn}, "
                         f"{rec['run_concurrency']} at a time ({'staggered' if rec['run_staggered'] else 'fixed'} "
                         f"lengths), {rec['run_running_seqs']:.0f} running ("
                         + (f"the run's cap of {rec['run_max_running_seqs']} and the engine's KV pool"
                            if rec.get("run_max_running_seqs") else "the engine's KV pool and sequence cap") + "), "
                         + steps)
        if rec.get("run_spec_k"):
            acc = ", ".join(f"{a:g}" for a in rec["run_spec_acceptance"])
            lines.append(f"  speculative: k={rec['run_spec_k']} drafts a round by {rec['run_spec_drafter']}"
                         + (f" ({rec['run_spec_draft_model']})" if rec.get("run_spec_draft_model") else "")
                         + (f" (draft vocabulary {rec['run_spec_draft_vocab']})"
                            if rec.get("run_spec_draft_vocab") else "")
                         + (f", a tree of width {rec['run_spec_draft_topk']} verifying {rec['run_spec_verify_tokens']} "
                            "tokens a sequence" if rec.get("run_spec_draft_topk", 1) > 1 else "")
                         + f", acceptance {acc}: {rec['run_spec_tokens_per_round']:.3g} tokens a round; ITL is the gap "
                         "between rounds, TPOT per token")
        for _, name, _ in RUN_METRICS[:-2]:  # the latencies and rates (running sequences and chunk: the line above)
            lines.append(f"  {name:<22} {rec[f'run_{name}']:.4g} ({rec[f'run_{name}_optimistic']:.4g}-"
                         f"{rec[f'run_{name}_pessimistic']:.4g})")
        if rec.get("run_spec_k"):
            if rec.get("run_spec_round_unmeasured"):
                lines.append(f"  a round's own time (sampling, verification bookkeeping, the draft passes' host work) "
                             f"is priors.yaml's spec_round_overhead_us for {', '.join(rec['run_spec_round_unmeasured'])}:"
                             " no measurement of it was read (engines.yaml spec_round_us, where an engine has one, is "
                             "a millisecond or more)")
            if rec.get("run_request_rate") and rec["run_running_seqs"] != rec.get("run_plain_running_seqs"):
                lines.append(f"  with speculation {rec['run_running_seqs']:.0f} in flight, without it "
                             f"{rec['run_plain_running_seqs']:.0f}: at one rate of arrivals a request that finishes "
                             "sooner leaves its slot sooner (Little's law; past the engine's cap, its queue)")
            elif rec["run_running_seqs"] < rec.get("run_plain_running_seqs", rec["run_running_seqs"]):
                lines.append(f"  with speculation {rec['run_running_seqs']:.0f} run at a time, without it "
                             f"{rec['run_plain_running_seqs']:.0f}: the engine's own cap when it speculates "
                             "(engines.yaml spec_max_running_seqs: SGLang's 48 unless --max-running-requests; "
                             "max_running_seqs= sets the run's own)")
            lines.append(f"  without speculation: output_tok_s {rec['run_plain_output_tok_s']:.4g}, tpot_ms "
                         f"{rec['run_plain_tpot_ms']:.4g}, e2e_latency_s {rec['run_plain_e2e_latency_s']:.4g}: "
                         f"speculative x{rec['run_spec_speedup']:.3g} output tok/s (typical priors)")
        if rec.get("run_note"):
            lines.append(f"  {rec['run_note']}")
    if rec.get("quality_note"):
        lines.append(f"note           {rec['quality_note']}")
    return "\n".join(lines)


def _as_released(cfg: ModelConfig, dtype: str) -> bool:
    """Every tensor class in the format the model is released in (its weights' native format, the rest in
    the activation dtype): the model's own outputs, nothing quantized beyond what its authors shipped."""
    p = parse_precision(dtype)
    return (p.weights.name == (cfg.native_weights or p.activations)
            and p.experts.name == (cfg.native_experts or p.weights.name)
            and p.kv.name == p.activations and p.lm_head.name == p.activations)


def req_moe(rec: dict) -> bool:
    return bool(rec.get("experts"))


def print_card(req: CardRequest) -> dict:
    rec = card_record(req)
    print(render_card(rec))
    print(files.json_text(rec))
    return rec


def run(c: dict) -> None:
    model = target_model(c)
    dtype = served_label(c["dtype"], c, model, priced_weights(c))
    print_card(CardRequest(model=model, dtype=dtype,
                           device=get_datasheet(c["device"]) if c["device"] else None,
                           batch=c["batch"], context=c["context"], engine=engine_name(c.get("engine")),
                           tp=c["tp"], ep=c["ep"], dp_attention=c["dp_attention"], input_len=c["input_len"],
                           output_len=c["output_len"], concurrency=c["concurrency"], num_prompts=c["num_prompts"],
                           request_rate=c["request_rate"],
                           staggered=c["staggered"], range_ratio=c["range_ratio"], client=c["client"],
                           prefill_chunk_tokens=c["prefill_chunk_tokens"], step_batching=c["step_batching"] or "",
                           max_running_seqs=c["max_running_seqs"],
                           graph_batch_sizes=graph_batch_sizes(c), calibrate=c.get("calibrate") or None, k=c["k"],
                           acceptance=c["acceptance"], drafter=c["drafter"], draft_vocab=c["draft_vocab"],
                           draft_topk=c["draft_topk"], draft_tokens=c["draft_tokens"],
                           draft_model=get_preset(c["draft_model"]) if c.get("draft_model") else None))
