"""Number formats per tensor class, as data: what a weight matrix or a KV cache entry really
occupies in memory, scales and zero points included.

A decode step at small batch is bound by the bytes it reads, so the format of the weights is
the largest lever on its time. A format is not just bits per element: int4 with groups of g
stores a scale and a zero point per g weights (in the activation dtype, the layout torch's
packed kernels take), so a g=32 layer costs 0.5 + 2·2/32 = 0.625 B/weight in bf16, not 0.5;
fp8 with DeepSeek-V3's 128x128 blocks stores one fp32 scale per 16,384 weights.

Names (`parse_format`):
  bf16 | fp16 | fp32 (or bfloat16 | float16 | float32)   plain floats, no scales
  fp8 | fp8_e4m3 | fp8_e5m2 [_tensor | _channel | _b128 | _b<R>x<C>]
        one fp32 scale per tensor (default), per output channel, or per R x C block
        (b128 = 128 x 128, DeepSeek-V3's weight_scale_inv)
  int8                  weight-only, symmetric, one scale per output channel
  int8_g<g>             weight-only, symmetric, one scale per g weights along K (priced, not run here)
  int4_g<g>             weight-only, asymmetric, a scale and a zero point per g weights along K
  int4_g<g>_sym         weight-only, symmetric: a scale per g weights, no zero point (compressed-tensors'
                        pack-quantized W4A16, Kimi-K2.5's released experts: group 32, 4.5 bits a weight);
                        priced by the what-if, not run here (the decoder's int4 kernel takes a zero point)
  mxfp4                 OCP microscaling fp4 (e2m1): one e8m0 scale (1 B) per 32 weights along K
                        (gpt-oss's released experts): 4.25 bits a weight
  nvfp4                 NVIDIA fp4 (e2m1): one fp8 e4m3 scale per 16 weights along K and one fp32
                        scale per tensor: 4.5 bits a weight
        fp4 multiplies on fp4 tensor cores where the device has them (a datasheet fp4 rate: Blackwell),
        else a weight-only kernel dequantises it to the activations (Hopper, Ampere, CDNA3)
  q8_0 | q4_0 | q4_1 | q4_k | q6_k  llama.cpp's GGUF block formats (ggml-common.h), their bytes exactly, priced
                        by the what-if and not run here: q8_0 32 int8 + an fp16 scale (8.5 bits a weight),
                        q4_0 32 int4 + an fp16 scale (4.5), q4_1 + an fp16 minimum as well (5.0), q4_k
                        super-blocks of 256 with 6-bit scales and minima per 32 and an fp16 pair (144
                        bytes: 4.5 bits a weight), q6_k 210 bytes per 256 (6.5625 bits); a mixed file (Q4_K_M:
                        Q6_K for some tensors) has no one format: price it by the format most of its weights
                        take. Its LM head, unless lm_head= says otherwise, is the output tensor llama.cpp's
                        quantizer writes (gguf_output_format: Q6_K, Q8_0 in a Q8_0 file)
  KV cache: fp8 | fp8_e4m3 | fp8_e5m2 (one fp32 scale per layer for K and one for V, as vLLM's
  fp8 cache; MLA's latent cache: one), int8 (symmetric, one fp32 scale per token per KV head),
  q8_0 | q4_0 (llama.cpp's -ctk / -ctv block formats, a scale per 32 elements; priced, not run here).

A `Precision` gives each tensor class its format: activations (a float dtype; the embedding
table, norms, biases and the MoE router stay in it), weights (every other linear), the routed
experts (default: the weights' format; gpt-oss releases mxfp4 experts beside bf16 attention),
the KV cache and the LM head. Its `label` (e.g. `bfloat16+weights=int4_g128+kv=fp8_e4m3`) is the key
rows, fits and predictions carry in their `dtype` field; a plain dtype name is the label of
an all-float precision, so every existing dtype is a valid precision.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from roofline.io.fields import ConfigError
from roofline.model.dtypes import dtype_bytes, dtype_name

KINDS = ("float", "fp8", "int8", "int4", "fp4")
CLASSES = ("weights", "experts", "kv", "lm_head")
FP8_SCALE_BYTES = 4  # fp32 scales (DeepSeek-V3's weight_scale_inv, vLLM's k_scale / v_scale)
NAMES_HELP = ("bf16 | fp16 | fp32 | fp8[_e4m3|_e5m2][_tensor|_channel|_b128|_b<R>x<C>] | int8[_g<g>] | int4_g<g>[_sym] "
              "| mxfp4 | nvfp4 | q8_0 | q4_0 | q4_1 | q4_k | q5_k | q6_k | q4_k_m | q5_k_m (weights, experts); "
              "bf16 | fp16 | fp32 | fp8[_e4m3|_e5m2] | int8 | q8_0 | q4_0 (kv)")


@dataclass(frozen=True)
class Format:
    """How one tensor class is stored. granularity: 'none' (plain float), 'tensor', 'channel'
    (per output row), 'block' (block rows x cols), 'group' (groups of `group` along K),
    'token' (KV: per token per KV head). scale_bytes 0 means: the activation dtype's size."""

    name: str
    kind: str
    bits: int
    granularity: str = "none"
    block: tuple[int, int] = (0, 0)
    group: int = 0
    scale_bytes: int = 0
    zero_point: bool = False
    storage: str = ""  # torch dtype of the stored elements
    tensor_scale_bytes: int = 0  # one more scale per matrix (nvfp4's fp32 global scale)
    family: str = ""  # "ggml": a llama.cpp GGUF block format (priced by the what-if; no kernel of this code runs it)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def scale_size(self, act_bytes: int) -> int:
        return self.scale_bytes or act_bytes

    def scales(self, N: int, K: int) -> int:
        """Scale count of an [N, K] weight matrix (zero points: as many again)."""
        g = self.granularity
        if g == "none":
            return 0
        if g == "tensor":
            return 1
        if g == "channel":
            return N
        if g == "block":
            return math.ceil(N / self.block[0]) * math.ceil(K / self.block[1])
        if g == "group":
            return N * math.ceil(K / self.group)
        raise ValueError(f"format {self.name!r}: granularity {g!r} has no per-matrix scales")

    def matrix_bytes(self, N: int, K: int, act_bytes: int) -> int:
        """Exact bytes of an [N, K] weight matrix: packed elements + scales (+ zero points)."""
        elems = N * K * self.bits // 8 if self.bits >= 8 else N * math.ceil(K * self.bits / 8)
        per = self.scale_size(act_bytes) * (2 if self.zero_point else 1)
        return elems + self.scales(N, K) * per + self.tensor_scale_bytes

    def kv_token_bytes(self, elems: int, heads: int, act_bytes: int) -> int:
        """Bytes one token adds to one layer's cache: `elems` elements over `heads` KV heads (a block format:
        a scale per `group` elements of each head's row, as llama.cpp quantizes a cache row)."""
        data = elems * self.bits // 8
        if self.granularity == "group":
            return data + heads * math.ceil(elems / heads / self.group) * self.scale_size(act_bytes)
        return data + (heads * self.scale_size(act_bytes) if self.granularity == "token" else 0)

    def kv_layer_fixed_bytes(self, act_bytes: int, tensors: int = 2) -> int:
        """Per-layer bytes independent of tokens: the per-tensor scales of the layer's cache
        tensors (K and V; MLA's one latent cache: 1)."""
        return tensors * self.scale_size(act_bytes) if self.granularity == "tensor" else 0

    def dequant_ops_per_weight(self) -> int:
        """Element operations a weight-only kernel spends turning one stored weight into the
        matmul's dtype each forward: int8 a conversion (its scale multiplies the output row);
        int4 unpack + (q - 8)·s + z; fp4 (where no fp4 tensor core takes it) a table lookup of the
        e2m1 code and its group's scale. fp8 on tensor cores: none (scales apply to outputs or
        block partial sums). Reported apart from FLOPs."""
        return {"int8": 1, "int4": 3, "fp4": 2}.get(self.kind, 0)


FP4 = {"mxfp4": Format("mxfp4", "fp4", 4, "group", group=32, scale_bytes=1, storage="uint8"),
       "nvfp4": Format("nvfp4", "fp4", 4, "group", group=16, scale_bytes=1, storage="uint8",
                       tensor_scale_bytes=FP8_SCALE_BYTES)}


# llama.cpp's GGUF block formats (ggml-common.h block_q8_0, block_q4_0, block_q4_1, block_q4_K): bytes per block of
# 32 weights along K = the packed quants + fp16 scales (q4_1: a scale and a minimum; q4_k: 144 bytes per 256 weights,
# 6-bit scales and minima per 32 plus an fp16 pair per 256 = 2 bytes per 32, written as one 2-byte scale per 32)
GGML = {"q8_0": Format("q8_0", "int8", 8, "group", group=32, scale_bytes=2, storage="int8", family="ggml"),
        "q4_0": Format("q4_0", "int4", 4, "group", group=32, scale_bytes=2, storage="uint8", family="ggml"),
        "q4_1": Format("q4_1", "int4", 4, "group", group=32, scale_bytes=2, zero_point=True, storage="uint8",
                       family="ggml"),
        "q4_k": Format("q4_k", "int4", 4, "group", group=32, scale_bytes=2, storage="uint8", family="ggml"),
        # block_q6_K: 256 weights in 210 bytes (ql[128] + qh[64] = 6 bits a weight, 16 int8 scales and an fp16 d),
        # written as 6-bit quants and 18 bytes of scales per 256; a sub-byte format unpacked in registers as q4_k
        "q6_k": Format("q6_k", "int4", 6, "group", group=256, scale_bytes=18, storage="uint8", family="ggml"),
        # block_q5_K: 176 bytes per 256 weights (5.5 bits), written as q4_k is: 5-bit quants and 2 bytes per 32
        "q5_k": Format("q5_k", "int4", 5, "group", group=32, scale_bytes=2, storage="uint8", family="ggml")}
# llama.cpp's mixed file types (LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M) and the type most of their tensors take: each is
# its base type's format under its own name, the tensors its quantizer gives more bits priced by
# `gguf_tensor_formats` (accounting.weight_matrix_bytes)
GGUF_K_M = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}
GGML.update({mix: replace(GGML[base], name=mix) for mix, base in GGUF_K_M.items()})
GGML_KV = ("q8_0", "q4_0")  # llama.cpp's -ctk / -ctv cache types of these families
GGUF_FALCON = ("FalconForCausalLM", "RWForCausalLM")  # Hugging Face architectures llama.cpp reads as LLM_ARCH_FALCON


def gguf_more_bits(i: int, n_layer: int) -> bool:
    """Whether llama.cpp's quantizer gives layer i of n_layer more bits in a _M file (src/llama-quant.cpp,
    use_more_bits: 'i_layer < n_layers/8 || i_layer >= 7*n_layers/8 || (i_layer - n_layers/8)%3 == 2')."""
    return i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2


@lru_cache(maxsize=1024)  # asked for each matrix of every priced pass
def gguf_tensor_formats(weights: Format, role: str, cfg) -> tuple[tuple[Format, float], ...]:
    """The formats (with the share of the model's layers in each) that llama.cpp's quantizer writes one tensor role
    of a decoder layer in, in a file of type `weights` (src/llama-quant.cpp, llama_tensor_get_type, for the file
    types priced here): role attn_q, attn_k, attn_v, attn_output, attn_qkv (a fused projection), ffn_down (dense,
    shared or routed experts') or other. Q4_K_M / Q5_K_M: attn_v and ffn_down in Q6_K in the use_more_bits layers
    (gguf_more_bits, half of them or so); a 70B model's (llama.cpp's LLM_TYPE_70B: 80 layers) Q4_K attn_v taken to
    Q5_K; a fused attn_qkv in Q5_K (Q4_K_M) or Q6_K (Q5_K_M); Falcon's Q4_K_M ffn_down in Q6_K in the first n/16
    layers, Q5_K in the use_more_bits ones. Any file type of an 8-expert model (Mixtral): attn_k and attn_v in Q8_0,
    and Q4_K_M's attn_output in Q5_K. Every other tensor: the file's base type. `cfg`: the model (its layers, experts
    and architecture)."""
    base = GGML[GGUF_K_M.get(weights.name, weights.name)]
    n, falcon, mix = cfg.layers, cfg.architecture in GGUF_FALCON, weights.name in GGUF_K_M
    if cfg.experts == 8 and role in ("attn_k", "attn_v"):
        return ((GGML["q8_0"], 1.0),)
    if cfg.experts == 8 and role == "attn_output" and weights.name == "q4_k_m" and not falcon:
        return ((GGML["q5_k"], 1.0),)
    if not mix:
        return ((base, 1.0),)

    def layer(i: int) -> str:  # the type of layer i's tensor of this role
        more = gguf_more_bits(i, n)
        if role == "attn_v":
            return "q6_k" if more else ("q5_k" if base.name == "q4_k" and n == 80 else base.name)
        if role == "attn_qkv":
            return "q5_k" if base.name == "q4_k" else "q6_k"
        if role == "ffn_down" and falcon and base.name == "q4_k":
            return "q6_k" if i < n // 16 else ("q5_k" if more else base.name)
        if role == "ffn_down":
            return "q6_k" if more else base.name
        return base.name
    names = [layer(i) for i in range(n)]
    return tuple((GGML[t], names.count(t) / n) for t in dict.fromkeys(names))


def gguf_output_format(weights: Format, d: int | None = None, architecture: str = "") -> Format:
    """The format llama.cpp's quantizer gives a GGUF file's output tensor (the LM head) when the file's main type is
    `weights` and no --output-tensor-type is given (src/llama-quant.cpp, llama_tensor_get_type: 'else if
    (new_type != GGML_TYPE_Q8_0) new_type = GGML_TYPE_Q6_K', after 'arch == LLM_ARCH_FALCON || nx % qk_k != 0'
    gives Q8_0): Q8_0 in a Q8_0 file, on Falcon, or where the row length d is not a multiple of Q6_K's
    256-weight super-block (its group); else Q6_K. d None: not known, taken as a multiple."""
    q6 = GGML["q6_k"]
    if weights.name == "q8_0" or (d is not None and d % q6.group) or architecture in GGUF_FALCON:
        return GGML["q8_0"]
    return q6


def _fp8(variant: str, gran: str, name: str, kv: bool) -> Format:
    storage = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[variant]
    base = f"fp8_{variant}"
    if kv:
        if gran not in ("", "tensor"):
            raise ConfigError(f"kv={name!r}: an fp8 KV cache has one scale per layer for K and V; allowed "
                              "fp8 | fp8_e4m3 | fp8_e5m2")
        return Format(base, "fp8", 8, "tensor", scale_bytes=FP8_SCALE_BYTES, storage=storage)
    if gran in ("", "tensor"):
        return Format(base, "fp8", 8, "tensor", scale_bytes=FP8_SCALE_BYTES, storage=storage)
    if gran == "channel":
        return Format(f"{base}_channel", "fp8", 8, "channel", scale_bytes=FP8_SCALE_BYTES, storage=storage)
    m = re.fullmatch(r"b(\d+)(?:x(\d+))?", gran)
    if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
        raise ConfigError(f"weights={name!r}: fp8 granularity {gran!r}; allowed _tensor, _channel, _b<N>, _b<R>x<C>")
    r, c = int(m.group(1)), int(m.group(2) or m.group(1))
    label = f"b{r}" if r == c else f"b{r}x{c}"
    return Format(f"{base}_{label}", "fp8", 8, "block", block=(r, c), scale_bytes=FP8_SCALE_BYTES, storage=storage)


def parse_format(name: str, tensor_class: str = "weights") -> Format:
    """A format from its name (module docstring); ConfigError naming the field and what is allowed. A name given as
    text is parsed once (the what-if asks for the same few formats hundreds of thousands of times in one table of
    anchors); anything else (a list from the command line) is parsed, and refused, as it comes."""
    if isinstance(name, str) and isinstance(tensor_class, str):
        return _format_of_text(name, tensor_class)
    return _parse_format(name, tensor_class)


@lru_cache(maxsize=512)
def _format_of_text(name: str, tensor_class: str) -> Format:
    return _parse_format(name, tensor_class)  # a Format is frozen: one object may serve every caller


def _parse_format(name, tensor_class: str) -> Format:
    if tensor_class not in CLASSES:
        raise ValueError(f"tensor_class={tensor_class!r}: allowed {CLASSES}")
    raw = str(name).strip().lower()
    kv = tensor_class == "kv"
    if raw in FP4 and not kv:
        return FP4[raw]
    if raw in GGML and (not kv or raw in GGML_KV):
        return GGML[raw]
    if not raw.startswith(("fp8", "int")) and raw not in FP4 and raw not in GGML:  # a float dtype of the decoder
        try:
            short = dtype_name(raw)
        except ConfigError:
            raise ConfigError(f"{tensor_class}={name!r}: unknown format; allowed {NAMES_HELP}") from None
        return Format(short, "float", 8 * dtype_bytes(short), storage=short)
    m = re.fullmatch(r"fp8(?:_(e4m3|e5m2))?(?:_(.+))?", raw)
    if m:
        return _fp8(m.group(1) or "e4m3", m.group(2) or "", name, kv)
    if raw == "int8":
        if kv:
            return Format("int8", "int8", 8, "token", scale_bytes=4, storage="int8")
        return Format("int8", "int8", 8, "channel", storage="int8")
    m = re.fullmatch(r"int8_g(\d+)", raw)
    if m and not kv:
        g = int(m.group(1))
        if g < 2 or g & (g - 1):
            raise ConfigError(f"{tensor_class}={name!r}: group size {g} must be a power of two >= 2")
        return Format(f"int8_g{g}", "int8", 8, "group", group=g, storage="int8")
    m = re.fullmatch(r"int4_g(\d+)(_sym)?", raw)
    if m and not kv:
        g, sym = int(m.group(1)), bool(m.group(2))
        if g < 2 or g & (g - 1):
            raise ConfigError(f"{tensor_class}={name!r}: group size {g} must be a power of two >= 2")
        return Format(f"int4_g{g}" + ("_sym" if sym else ""), "int4", 4, "group", group=g, zero_point=not sym,
                      storage="uint8")
    raise ConfigError(f"{tensor_class}={name!r}: unknown format; allowed {NAMES_HELP}")


@dataclass(frozen=True)
class Precision:
    """The format of each tensor class of a forward pass."""

    activations: str = "bfloat16"
    weights: Format | None = None  # None: the activation dtype
    kv: Format | None = None
    lm_head: Format | None = None
    experts: Format | None = None  # None: the weights' format

    def __post_init__(self) -> None:
        act = dtype_name(self.activations)
        object.__setattr__(self, "activations", act)
        plain = parse_format(act)
        for f in CLASSES:
            if getattr(self, f) is None:
                object.__setattr__(self, f, self.weights if f == "experts" else plain)

    @property
    def act_bytes(self) -> int:
        return dtype_bytes(self.activations)

    @property
    def is_plain(self) -> bool:
        """Every class in the activation dtype: the old single-dtype world."""
        return all(getattr(self, f).name == self.activations for f in CLASSES)

    @property
    def label(self) -> str:
        parts = [self.activations]
        parts += [f"{f}={getattr(self, f).name}" for f in CLASSES
                  if getattr(self, f).name != (self.weights.name if f == "experts" else self.activations)]
        return "+".join(parts)

    def __str__(self) -> str:
        return self.label


def precision(dtype="bfloat16", weights: str | None = None, kv: str | None = None, lm_head: str | None = None,
              native: str = "", experts: str | None = None, native_experts: str = "", model=None) -> Precision:
    """A precision from a dtype (or an existing label) and per-class overrides; None keeps what
    the label says. weights='native': the format the preset or checkpoint is released in (its experts
    in `native_experts` where the release quantizes only those, as gpt-oss); experts='native' the
    release's expert format. New weights without experts= move the experts with them, unless the
    label gave the experts their own format. New GGUF weights (weights=q8_0, q4_0, ...) with the LM head left
    unsaid (no lm_head=, a float LM head in the label) bring the output tensor llama.cpp's quantizer writes beside
    them (`gguf_output_format`: Q6_K, or Q8_0; `model`, where given, its d and architecture decide); a label is
    read as it says."""
    base = parse_precision(dtype)
    own_experts = base.experts.name != base.weights.name
    if weights == "native":
        weights = native or base.activations
        experts = experts or native_experts or None
    if experts == "native":
        experts = native_experts or native or base.activations
    pick = lambda v, cls, cur: cur if v in (None, "") else parse_format(v, cls)  # noqa: E731
    w = pick(weights, "weights", base.weights)
    e = pick(experts, "experts", base.experts if own_experts else w)
    head = pick(lm_head, "lm_head", base.lm_head)
    if lm_head in (None, "") and weights not in (None, "") and head.is_float and w.family == "ggml":
        head = gguf_output_format(w, getattr(model, "d", None), getattr(model, "architecture", ""))
    return Precision(base.activations, w, pick(kv, "kv", base.kv), head, e)


def parse_precision(p) -> Precision:
    """Precision from a Precision, a torch dtype, a dtype name or a label `act+cls=fmt+...`."""
    if isinstance(p, Precision):
        return p
    return _precision_of_text(str(p).removeprefix("torch."))


@lru_cache(maxsize=512)
def _precision_of_text(text: str) -> Precision:
    """parse_precision of a label, parsed once (a Precision is frozen)."""
    act, *rest = text.split("+")
    kw = {}
    for part in rest:
        cls, _, fmt = part.partition("=")
        if cls not in CLASSES or not fmt:
            raise ConfigError(f"precision {text!r}: part {part!r}; allowed <dtype>+<class>=<format> with "
                              f"class in {CLASSES}")
        kw[cls] = parse_format(fmt, cls)
    return Precision(act, **kw)


def activation_dtype(p) -> str:
    """The float dtype name of a precision or label (what the datasheet's FLOP/s are quoted in)."""
    return parse_precision(p).activations


def precision_columns(p) -> dict:
    """The per-class formats of a precision, as row columns."""
    p = parse_precision(p)
    return dict(act_dtype=p.activations, weights_format=p.weights.name, kv_format=p.kv.name,
                lm_head_format=p.lm_head.name, experts_format=p.experts.name)


def with_overrides(dtypes, weights: str | None = None, kv: str | None = None, lm_head: str | None = None,
                   native: str = "", experts: str | None = None, native_experts: str = "",
                   model=None) -> tuple[str, ...]:
    """The precision labels of a list of dtypes under the `weights= kv= lm_head= experts=` overrides."""
    return tuple(precision(d, weights, kv, lm_head, native, experts, native_experts, model).label for d in dtypes)


def compute_dtype(p, cls: str = "weights") -> str:
    """The dtype whose datasheet FLOP/s the matmuls of a weight class (weights or experts) run at: fp8
    weights multiply on fp8 tensor cores (activations quantised per call), fp4 on fp4 tensor cores
    (where a device has none, the what-if falls back to the activations': roofline.parallel.whatif);
    weight-only int8/int4 dequantise to the activations."""
    p = parse_precision(p)
    kind = getattr(p, cls).kind
    return {"fp8": "float8_e4m3fn", "fp4": "float4_e2m1"}.get(kind, p.activations)


QUALITY_NOTE = ("quantization changes the model's outputs: acceptance rates measured in one precision may not "
                "hold in another (measure them with roofline.cli.acceptance in the served precision)")
