"""Serving-engine profiles as data (roofline/data/engines.yaml, chosen by `engine=`).

A profile says what an engine adds to the kernels of a step and how it runs them: its per-step
host and scheduler time not hidden behind the GPU (a fixed part and, where measured, a part per running
sequence: the scheduler's loops over the batch), whether it replays CUDA graphs (the per-layer
launch floor of roofline/data/priors.yaml; without them, the host's issue beside the GPU's work), and
its all-reduce latency per interconnect. An engine that launches every kernel from Python without graphs (`host_issue`:
kernel launches per decoder layer and host microseconds per launch) is priced as an in-order queue:
the host issues every launch of a step's layers while the GPU runs what it was given, so the step
takes the later of the two and only the host's excess over the layers' GPU work is a term
(roofline.parallel.whatif.host_issue_seconds). Its KV pool (`kv_pool`: the memory
share it claims) bounds how many sequences of a finite run it keeps running (roofline.parallel.whatif.serve). Each value is a triple (optimistic, typical, pessimistic) with a source and the
engine version it was read for. No engine named: the what-if runs every profile and its
interval spans them (roofline.parallel.whatif), an earlier release's or a vendor build's variant of another
profile (`release_of`, `spanned`) left out: it is priced when named.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from roofline.io.fields import ConfigError
from roofline.io.yamltext import load_yaml
from roofline.parallel.kernels import pick

ENGINES_PATH = Path(__file__).resolve().parents[1] / "data" / "engines.yaml"


@lru_cache(maxsize=4)
def load_engines(path: str = str(ENGINES_PATH)) -> dict:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"engines={path!r}: no such file (the engine profiles)")
    doc = load_yaml(p.read_text()) or {}
    return doc.get("engines", doc)


LOCAL_KINDS = ("sliding", "chunked")  # ModelConfig.local_kind: a sliding window or an attention chunk


@dataclass(frozen=True)
class Engine:
    """One engine profile at one scenario index (0 optimistic, 1 typical, 2 pessimistic)."""
    name: str
    graphs: bool
    step_overhead_s: float  # per forward: host + scheduler time the GPU waits for
    per_layer_s: float | None  # per decoder block launch floor; None: priors.yaml's graph / eager floor
    allreduce_latency_s: dict  # interconnect key -> seconds of one small all-reduce
    bw_scale: float = 1.0  # reserved: an engine-level weights_bw_fraction (none is published: kernels.yaml decides)
    launches_per_layer: float | None = None  # host_issue: kernels the host launches per decoder layer (no graphs)
    host_s_per_launch: float = 0.0  # host_issue: host (Python + dispatcher + driver) seconds per launch
    launches_per_expert: float = 0.0  # host_issue: kernels an MoE layer launches per touched expert (a Python loop)
    fp16_accumulate: bool = False  # its fp16 GEMMs accumulate in fp16 (the device's fp16-accumulate tensor rate)
    step_overhead_per_seq_s: float = 0.0  # host time per running sequence per step (the scheduler's loops over the batch)
    attention_bw_fraction: float | None = None  # its own decode-attention kernel's streaming fraction (None: kernels.yaml's)
    fused_moe: bool = False  # its MoE experts run vLLM's Triton fused_moe (kernels.yaml grouped_gemm's measured kernel)
    grouped_bw_ratio: tuple = ()  # ((weight format, ratio), ...): its own quantized experts' kernel streams at ratio x the grouped curve
    kv_pool_fraction: float | None = None  # device memory it claims for weights + KV (of "total") or for KV (of "free"); None: no cap
    kv_pool_of: str = "total"
    merged: tuple = ()  # linears it runs as one GEMM (engines.yaml merged_gemms: "gate_up", "qkv_a")
    prefill_chunk_tiers: tuple = ()  # engines.yaml prefill_chunk_tokens: its default tokens per step, by device (tiers)
    max_running_tiers: tuple = ()  # engines.yaml max_running_seqs: its default cap on running sequences, by device
    spec_max_running_tiers: tuple = ()  # engines.yaml spec_max_running_seqs: that cap with speculative decoding on,
    #                                      where the engine sets its own (SGLang's 48)
    local_reads: tuple = LOCAL_KINDS  # engines.yaml local_attention.reads: windowed kinds whose decode reads the window only
    local_pool: tuple = ()  # ((kind, "window" | "full" | fraction), ...): what its KV pool holds for windowed layers
    step_batching: str = "beside"  # engines.yaml step_batching: how a prompt chunk shares a step with the decodes (STEP_BATCHING)
    dp_limits: str = "whole"  # engines.yaml dp_attention_limits: its chunk and sequence caps bound each attention-DP rank or all
    mxfp4_activations: str = "bf16"  # engines.yaml mxfp4_activations: what its fp4 tensor-core kernels multiply mxfp4 weights with
    graph_sizes: tuple = ()  # engines.yaml graph_padding: the decode batches it captures and pads a decode-only step up to
    prefill_host_s_per_layer: tuple = ()  # ((layer kind, seconds), ...): engines.yaml eager_prefill_host_us_per_layer
    graph_pad_unit: str = "sequences"  # engines.yaml graph_padding.unit: what it pads to a captured size (GRAPH_PAD_UNITS)
    one_reduce_parallel: tuple = ()  # engines.yaml parallel_block_reduces: architectures whose parallel block it reduces once
    kv_repeat_share: float = 0.0  # engines.yaml gqa_decode_kv_reads: a GQA KV head's repeated reads (once per query head) from DRAM
    kv_repeat_copies: bool = False  # engines.yaml gqa_decode_kv_reads materialised: the repeats are copies written first
    kv_concat: bool = False  # engines.yaml kv_cache_update concat: each step reads the whole cache and writes it anew
    chunked_prefill_v0: bool = False  # engines.yaml chunked_prefill v0_default: on or off by vLLM V0's default rule
    kv_reads_allocated: bool = False  # engines.yaml kv_cache_reads allocated: decode attends over the whole static cache
    embedding_on_host: bool = False  # engines.yaml input_embedding host: the embedding table stays in host memory
    allreduce_busbw_Bps: tuple = ()  # ((interconnect key, bytes/s), ...): its own all-reduce's bus bandwidth
    spec_round_s: float | None = None  # engines.yaml spec_round_us: a speculative round's own time (None: the prior)
    spec_draft_pass_s: float = 0.0  # engines.yaml spec_draft_pass_us: each draft pass's time beyond its priced GPU time
    spec_round_ngram: bool = False  # engines.yaml spec_round_us.rounds all: n-gram rounds pay spec_round_s too

    def block_reduces(self, cfg) -> int:
        """All-reduces of one block's activations under tensor parallelism: 2 (attention's and the FFN's row-parallel
        outputs, each reduced: Megatron's RowParallelLinear default), 1 for a parallel block whose two partial outputs
        this engine's model code sums before reducing once (engines.yaml parallel_block_reduces, by architecture)."""
        return 1 if cfg.parallel_block and cfg.architecture in self.one_reduce_parallel else 2


def local_attention(e: dict, where: str) -> tuple[tuple, tuple]:
    """engines.yaml local_attention of a profile: (kinds read windowed, ((kind, pool rule), ...)); absent: both
    kinds read windowed (the model's math), every pool full."""
    la = e.get("local_attention")
    if la is None:
        return LOCAL_KINDS, ()
    reads = tuple(la.get("reads") or ())
    pool = la.get("pool") or {}
    bad = [k for k in (*reads, *pool) if k not in LOCAL_KINDS]
    if bad:
        raise ConfigError(f"{where}.local_attention: {bad!r}: allowed kinds {list(LOCAL_KINDS)}")
    for k, v in pool.items():
        if v not in ("window", "full") and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise ConfigError(f"{where}.local_attention.pool.{k}={v!r}: allowed window | full | a fraction in (0, 1]")
    return reads, tuple(pool.items())


# engines.yaml step_batching: how a finite run's prompt chunks share the engine's steps with its decodes.
#   shared         one step holds the decodes and a prompt chunk, and its token budget (prefill_chunk_tokens) counts
#                  both: the chunk is the budget less one token per decode (1 + k with k drafts)
#   prefill_first  a step runs prompts alone, before any decode, while prompts wait (the decodes pause for it)
#   beside         the chunk whole beside the decodes (absent: the engine's scheduler not read)
STEP_BATCHING = ("shared", "prefill_first", "beside")


# engines.yaml dp_attention_limits: what the engine's prefill_chunk_tokens and max_running_seqs bound under attention
# data parallelism: each rank's own batch (per_rank) or the deployment's, divided among its ranks (whole)
DP_LIMITS = ("per_rank", "whole")


# engines.yaml spec_round_us.rounds: the rounds its own round time is paid in: those with a drafter's forward passes
# (drafted: vLLM's, measured with EAGLE heads) or every round, n-gram's too (all: SGLang's overlap is off for all)
SPEC_ROUNDS = ("drafted", "all")


MX_ACTS = ("fp8", "bf16")  # engines.yaml mxfp4_activations: mxfp8 activations (W4A8) or the activations' bf16 (W4A16)

# engines.yaml gqa_decode_kv_reads: whether a GQA model's decode attention reads each KV head once (shared by its query
# heads: FlashAttention, FlashInfer, XQA), once per query head (one thread block per query head: TensorRT-LLM's masked
# multi-head attention kernel before XQA), or from a copy per query head written first (materialised: transformers'
# repeat_kv before SDPA)
KV_READS = ("shared", "per_query_head", "materialised")

# engines.yaml kv_cache_update: how a decode step adds its tokens' K and V to the cache: written in place (a paged or
# preallocated cache) or by concatenation (transformers' DynamicCache: torch.cat reads the whole cache and writes it
# anew, one token longer, every step)
KV_UPDATES = ("in_place", "concat")

# engines.yaml chunked_prefill: always (the engine's step_batching and prefill_chunk_tokens as written), or v0_default:
# vLLM V0's _set_default_args_v0, on for a model of more than 32K tokens of context on CUDA without MLA, sliding
# windows or speculation (then its steps are `shared`, 2048 tokens), else off: the V0 scheduler's prompt steps alone
# (`prefill_first`), whole prompts up to max_num_batched_tokens = max(max_model_len, 2048) (whatif.v0_chunked_prefill)
CHUNKED_PREFILL = ("always", "v0_default")

# engines.yaml kv_cache_reads: what a decode step's attention reads of a sequence's cache: the tokens so far (filled)
# or the whole static cache the run allocated, masked (allocated: gpt-fast's prompt + max_new_tokens, a multiple of 8)
KV_CACHE_READS = ("filled", "allocated")
INPUT_EMBEDDING = ("device", "host")  # engines.yaml input_embedding: where the engine keeps the embedding table


def graph_sizes(sizes, where: str) -> tuple[int, ...]:
    """A list of CUDA-graph batch sizes, sorted: each entry a size or a range [first, last, step] (inclusive);
    anything else is one error naming `where`."""
    if sizes is None:
        return ()
    if not isinstance(sizes, (list, tuple)):
        raise ConfigError(f"{where}: {sizes!r}: needs a list of sizes or [first, last, step] ranges")
    out = set()

    def ok(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 1
    for r in sizes:
        if ok(r):
            out.add(r)
        elif isinstance(r, (list, tuple)) and len(r) == 3 and all(ok(x) for x in r) and r[0] <= r[1]:
            out.update(range(r[0], r[1] + 1, r[2]))
        else:
            raise ConfigError(f"{where}: {r!r}: allowed a size >= 1 or a range [first, last, step] of them")
    return tuple(sorted(out))


def graph_batch_sizes(c) -> tuple[int, ...] | None:
    """The `graph_batch_sizes` key of a pricing command's config: None (the engine's default) or the sizes, checked."""
    v = c.get("graph_batch_sizes")
    return None if v is None else graph_sizes(v, "graph_batch_sizes")


GRAPH_PAD_UNITS = ("sequences", "tokens")  # engines.yaml graph_padding.unit: a decode step's requests, or its tokens


def graph_pad_unit(e: dict, where: str) -> str:
    """engines.yaml graph_padding.unit of a profile: sequences (absent: a decode step's requests padded, TensorRT-LLM's
    and SGLang's batch) or tokens (its tokens, vLLM V1's num_scheduled_tokens); anything else one error naming it."""
    unit = (e.get("graph_padding") or {}).get("unit", "sequences")
    if unit not in GRAPH_PAD_UNITS:
        raise ConfigError(f"{where}.graph_padding.unit: {unit!r}: allowed {list(GRAPH_PAD_UNITS)}")
    return unit


PREFILL_HOST_KINDS = ("mla",)  # engines.yaml eager_prefill_host_us_per_layer: the layer kinds a figure is read for


def prefill_host(e: dict, scenario: int, where: str) -> tuple:
    """engines.yaml eager_prefill_host_us_per_layer of a profile: ((layer kind, seconds per layer), ...) at the
    scenario (absent: none priced); an unknown kind is one error naming the field."""
    entry = e.get("eager_prefill_host_us_per_layer") or {}
    bad = [k for k in entry if k not in PREFILL_HOST_KINDS]
    if bad:
        raise ConfigError(f"{where}.eager_prefill_host_us_per_layer: {bad!r}: allowed kinds {list(PREFILL_HOST_KINDS)}")
    return tuple((k, pick(v, scenario, f"{where}.eager_prefill_host_us_per_layer.{k}") * 1e-6) for k, v in entry.items())


def kv_repeat_share(e: dict, scenario: int, where: str) -> float:
    """engines.yaml gqa_decode_kv_reads of a profile at the scenario: 0 where its decode attention reads each KV head
    once (shared; absent), else the share of the repeated reads (one per further query head of the group) that reach
    DRAM (dram_share; materialised: the share of steps whose repeats are copies, written to DRAM and read back);
    anything else one error naming the field."""
    if choice(e, "gqa_decode_kv_reads", KV_READS, "shared", where) == "shared":
        return 0.0
    share = pick(e["gqa_decode_kv_reads"].get("dram_share"), scenario, f"{where}.gqa_decode_kv_reads.dram_share")
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"{where}.gqa_decode_kv_reads.dram_share: {share!r}: must be in [0, 1]")
    return float(share)


def padded_batch(b: int, sizes: tuple[int, ...]) -> int:
    """The batch a decode-only step runs at under CUDA graphs captured at `sizes` with padding: the smallest size
    >= b; b itself above the largest size (no graph, no padding) or without sizes."""
    return next((s for s in sizes if s >= b), b)


def choice(e: dict, key: str, allowed: tuple, default: str, where: str, field: str = "value") -> str:
    """engines.yaml <key>'s `field` (its `value`) of a profile, one of `allowed` (absent: `default`); anything else is
    one error naming the field (step_batching, dp_attention_limits, mxfp4_activations, gqa_decode_kv_reads,
    kv_cache_update, chunked_prefill, kv_cache_reads, input_embedding, spec_round_us.rounds)."""
    v = (e.get(key) or {}).get(field, default)
    if v not in allowed:
        name = key if field == "value" else f"{key}.{field}"
        raise ConfigError(f"{where}.{name}: {v!r}: allowed {list(allowed)}")
    return v


CLIENTS = ("server", "offline")  # how a run reaches the engine: its HTTP server, or its offline (LLM class) entry point


def device_tiers(e: dict, key: str, where: str) -> tuple:
    """engines.yaml `key` of a profile: ((min_mem_GiB, excluded name parts, server value, offline value), ...),
    the first tier a device meets applies (absent, or `tiers: null` with a source: no engine default, the caller's
    prior)."""
    entry = e.get(key)
    stated_none = isinstance(entry, dict) and "tiers" in entry and entry["tiers"] is None and entry.get("source")
    if entry is None or stated_none:
        return ()  # absent, or none stated with its source (a release that sets no such default)
    tiers = entry.get("tiers") if isinstance(entry, dict) else None
    if not isinstance(tiers, list) or not tiers:
        raise ConfigError(f"{where}.{key}: needs tiers: [{{min_mem_GiB, server, offline}}, ...] and a source")
    out = []
    for t in tiers:
        try:
            srv, off = int(t["server"]), int(t.get("offline", t["server"]))
            out.append((float(t.get("min_mem_GiB", 0)), tuple(t.get("exclude_names") or ()), srv, off))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{where}.{key}: tier {t!r}: needs server (and optionally offline, min_mem_GiB, "
                              "exclude_names)") from None
    if out[-1][0] != 0 or out[-1][1]:
        raise ConfigError(f"{where}.{key}: the last tier must take every device (min_mem_GiB 0, no exclude_names)")
    return tuple(out)


def run_scheduling(d: dict, where: str) -> dict:
    """A run's own scheduler settings from a mapping (an anchor's workload, a calibration point, the card's keys):
    prefill_chunk_tokens (its tokens per step: --max-num-batched-tokens, chunked_prefill_size, max_num_tokens) and
    step_batching (how its prompt chunks share the steps: a vLLM V0 run with --enable-chunked-prefill is `shared`) and
    max_running_seqs (its cap on running sequences: --max-num-seqs, --max-running-requests, max_batch_size), as
    serve's keyword arguments; absent or empty: the engine's. Anything else is one error naming the field."""
    out = {}
    cap = d.get("max_running_seqs")
    if cap not in (None, 0):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError(f"{where}max_running_seqs={cap!r}: must be an integer >= 1 (0 or absent: the engine's)")
        out["max_running"] = cap
    chunk = d.get("prefill_chunk_tokens")
    if chunk not in (None, 0):
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ConfigError(f"{where}prefill_chunk_tokens={chunk!r}: must be an integer >= 1 (0 or absent: the "
                              "engine's)")
        out["chunk_tokens"] = chunk
    batching = d.get("step_batching")
    if batching not in (None, ""):
        if batching not in STEP_BATCHING:
            raise ConfigError(f"{where}step_batching={batching!r}: allowed {list(STEP_BATCHING)} (empty or absent: "
                              "the engine's)")
        out["step_batching"] = batching
    return out


def check_client(client) -> str:
    """A run's client, server or offline (CLIENTS); anything else is one error naming it."""
    if client not in CLIENTS:
        raise ConfigError(f"client={client!r}: allowed {list(CLIENTS)}")
    return client


def tier_value(tiers: tuple, mem_bytes: float | None, device_key: str, client: str) -> int | None:
    """The value of the first tier the device meets (memory as the driver reports it, its key's name), for the
    client (server / offline, check_client); None without tiers."""
    gib = (mem_bytes or 0.0) / 2**30
    for min_gib, exclude, srv, off in tiers:
        if gib >= min_gib and not any(x in device_key for x in exclude):
            return srv if client == "server" else off
    return None


def names(path: str = str(ENGINES_PATH)) -> list[str]:
    return sorted(load_engines(path))


def spanned(path: str = str(ENGINES_PATH)) -> list[str]:
    """The profiles an unnamed engine spans: every one but an earlier release's or a vendor build's variant of
    another (`release_of: <profile>`, e.g. sglang-0.4 of sglang, vllm-v0-rocm of vllm-v0: priced when named,
    while the span counts each engine once, its median not pulled toward an engine listed twice)."""
    return list(_spanned(path))


@lru_cache(maxsize=4)
def _spanned(path: str) -> tuple[str, ...]:  # read once per file: every unnamed what-if asks for it
    engines = load_engines(path)
    for name, e in engines.items():
        base = (e or {}).get("release_of")
        if base is not None and (base not in engines or (engines[base] or {}).get("release_of") is not None):
            raise ConfigError(f"engines.{name}.release_of={base!r}: must name a profile that is no release of another")
    return tuple(sorted(n for n, e in engines.items() if (e or {}).get("release_of") is None))


def optional_pick(entry: dict | None, key: str, scenario: int, where: str, scale: float = 1.0, default=None):
    """entry[key]'s triple at the scenario times `scale` (a unit), or `default` where the key is absent or null."""
    if entry is None or entry.get(key) is None:
        return default
    return pick(entry[key], scenario, f"{where}.{key}") * scale


def profile(name: str, scenario: int, path: str = str(ENGINES_PATH)) -> Engine:
    engines = load_engines(path)
    if name not in engines:
        raise ConfigError(f"engine={name!r}: allowed {sorted(engines)}")
    e = engines[name]
    f = f"engines.{name}"
    try:
        local_reads, local_pool = local_attention(e, f)
        ar = {link: pick(v["latency_us"], scenario, f"{f}.allreduce.{link}.latency_us") * 1e-6
              for link, v in (e.get("allreduce") or {}).items()
              if isinstance(v, dict) and isinstance(v.get("latency_us"), (list, dict)) and not link.endswith("_large")}
        ar_bw = tuple((link, pick(v["busbw_GBps"], scenario, f"{f}.allreduce.{link}.busbw_GBps") * 1e9)
                      for link, v in (e.get("allreduce") or {}).items()
                      if isinstance(v, dict) and isinstance(v.get("busbw_GBps"), (list, dict)))
        graphs = e["cuda_graphs"]
        graphs = graphs.get("value") if isinstance(graphs, dict) else graphs
        if not isinstance(graphs, bool):
            raise ConfigError(f"{f}.cuda_graphs: {graphs!r} is not true or false")
        per_layer = e.get("per_layer_us")
        if isinstance(per_layer, dict) and per_layer.get("values") is None:
            per_layer = None
        host = e.get("host_issue")
        launches = None if host is None else pick(host["launches_per_layer"], scenario, f"{f}.host_issue.launches_per_layer")
        per_expert = optional_pick(host, "launches_per_touched_expert", scenario, f"{f}.host_issue", default=0.0)
        per_launch = 0.0 if host is None else pick(host["us_per_launch"], scenario, f"{f}.host_issue.us_per_launch") * 1e-6
        pool = e.get("kv_pool") or {}
        if pool and (pool.get("of") not in ("total", "free") or not 0 < float(pool.get("fraction", 0)) <= 1):
            raise ConfigError(f"{f}.kv_pool: {pool!r}: needs fraction in (0, 1] and of: total | free")
        return Engine(name=name, graphs=graphs,
                      step_overhead_s=pick(e["step_overhead_us"], scenario, f"{f}.step_overhead_us") * 1e-6,
                      step_overhead_per_seq_s=optional_pick(e, "step_overhead_per_seq_us", scenario, f, 1e-6, 0.0),
                      per_layer_s=None if per_layer is None else pick(per_layer, scenario, f"{f}.per_layer_us") * 1e-6,
                      allreduce_latency_s=ar, allreduce_busbw_Bps=ar_bw, launches_per_layer=launches,
                      host_s_per_launch=per_launch,
                      launches_per_expert=per_expert,
                      fp16_accumulate=(e.get("gemm_accumulate") or {}).get("value") == "fp16",
                      fused_moe=(e.get("moe_kernel") or {}).get("value") == "fused_moe",
                      attention_bw_fraction=(pick(e["attention_bw_fraction"], scenario, f"{f}.attention_bw_fraction")
                                             if (e.get("attention_bw_fraction") or {}).get("values") is not None else None),
                      grouped_bw_ratio=tuple((fmt, pick(v["bw_ratio"], scenario, f"{f}.grouped_weight_only.{fmt}.bw_ratio"))
                                             for fmt, v in (e.get("grouped_weight_only") or {}).items()),
                      kv_pool_fraction=float(pool["fraction"]) if pool else None, kv_pool_of=pool.get("of", "total"),
                      merged=merged_gemms(e, f), prefill_chunk_tiers=device_tiers(e, "prefill_chunk_tokens", f),
                      max_running_tiers=device_tiers(e, "max_running_seqs", f),
                      spec_max_running_tiers=device_tiers(e, "spec_max_running_seqs", f),
                      local_reads=local_reads, local_pool=local_pool,
                      step_batching=choice(e, "step_batching", STEP_BATCHING, "beside", f),
                      dp_limits=choice(e, "dp_attention_limits", DP_LIMITS, "whole", f),
                      mxfp4_activations=choice(e, "mxfp4_activations", MX_ACTS, "bf16", f),
                      graph_sizes=graph_sizes((e.get("graph_padding") or {}).get("sizes"), f"{f}.graph_padding.sizes"),
                      prefill_host_s_per_layer=prefill_host(e, scenario, f),
                      graph_pad_unit=graph_pad_unit(e, f),
                      one_reduce_parallel=one_reduce_parallel(e, f),
                      kv_repeat_share=kv_repeat_share(e, scenario, f),
                      kv_repeat_copies=choice(e, "gqa_decode_kv_reads", KV_READS, "shared", f) == "materialised",
                      kv_concat=choice(e, "kv_cache_update", KV_UPDATES, "in_place", f) == "concat",
                      chunked_prefill_v0=choice(e, "chunked_prefill", CHUNKED_PREFILL, "always", f) == "v0_default",
                      kv_reads_allocated=choice(e, "kv_cache_reads", KV_CACHE_READS, "filled", f) == "allocated",
                      embedding_on_host=choice(e, "input_embedding", INPUT_EMBEDDING, "device", f) == "host",
                      spec_round_s=optional_pick(e, "spec_round_us", scenario, f, 1e-6),
                      spec_draft_pass_s=optional_pick(e, "spec_draft_pass_us", scenario, f, 1e-6, 0.0),
                      spec_round_ngram=choice(e, "spec_round_us", SPEC_ROUNDS, "drafted", f, "rounds") == "all")
    except KeyError as err:
        raise ConfigError(f"{f}: missing key {err.args[0]!r}") from None


MERGEABLE = ("gate_up", "qkv_a")


def one_reduce_parallel(e: dict, where: str) -> tuple:
    """engines.yaml parallel_block_reduces of a profile: the architectures whose parallel block (attention and FFN on
    one input) it all-reduces once, their partial outputs summed first (a map architecture -> 1 or 2; absent: 2 for
    every architecture); anything else one error naming the field."""
    v = (e.get("parallel_block_reduces") or {}).get("value") or {}
    if not isinstance(v, dict) or any(n not in (1, 2) or isinstance(n, bool) for n in v.values()):
        raise ConfigError(f"{where}.parallel_block_reduces: {v!r}: needs a map architecture -> 1 or 2")
    return tuple(sorted(a for a, n in v.items() if n == 1))


def merged_gemms(e: dict, where: str) -> tuple:
    """engines.yaml merged_gemms of a profile: the linears it runs as one GEMM (absent: none)."""
    v = (e.get("merged_gemms") or {}).get("value") or []
    bad = [m for m in v if m not in MERGEABLE]
    if bad:
        raise ConfigError(f"{where}.merged_gemms: {bad!r}: allowed {list(MERGEABLE)}")
    return tuple(v)


def engine_name(entry) -> str | None:
    """The profile key of a config's `engine` entry (a roofline/conf/engine/ group dict, a name, or None)."""
    if entry is None or entry == "":
        return None
    if isinstance(entry, dict):
        if "profile" not in entry:
            raise ConfigError(f"engine={entry!r}: a roofline/conf/engine/ entry needs 'profile'")
        return str(entry["profile"])
    return str(entry)
