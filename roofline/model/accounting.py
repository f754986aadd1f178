"""What one forward pass of `roofline.model.decoder` must move and compute: the byte/FLOP model.

It describes the code beside it, not an idealised kernel, and the tests hold it to that:
parameter counts equal the instantiated modules, KV bytes equal the cache tensors.

Conventions (docs/design.md §2):
- Weight bytes: every weight the forward multiplies by, once, the LM head included (when
  tied, the embedding matrix read as the head), the embedding TABLE excluded: the forward
  gathers B·q rows of it (`embed_bytes`). MoE layers read the experts the batch touched:
  expected count U(N) = E·(1 − (1 − k/E)^N) under uniform routing for the "touched"
  implementation, all E for "dense". MTP modules are not part of the main forward.
- KV read: B · layers · (cache elements per token) · kv_len · b_kv, kv_len being the cache
  slice attention reads (L + q unless fixed); KV write: the same with q for kv_len. A
  quantized cache (roofline.model.kvcache) adds its scales: per token, or per layer. Sparse
  attention (DeepSeek-V3.2): the indexer's keys at every position, the latents of the
  selected ones only (ModelConfig.attended_positions).
- FLOPs: 2 · (matmul weights applied per token) · B · q, plus attention counted causally
  (useful work only): for query i at position L + i, L + i + 1 keys, each costing
  2·(d_qk + d_v) per head, i.e. 2·(d_qk + d_v)·h·layers·B·(q·L + q(q+1)/2).
  MLA in absorbed form has d_qk = kv_lora_rank + qk_rope_dim and d_v = kv_lora_rank; its
  W_UK/W_UV absorption is matmul work on the kv_b weights. Sparse attention caps a query's
  keys at index_topk and adds its indexer's 2·index_heads·index_head_dim per causal pair.
- Quantized formats (roofline.model.formats; `dtype` may be a precision label): each matrix
  in `block_matrices` / `expert_matrices` and the LM head costs its format's exact bytes (a
  GGUF file's, by the tensor role llama.cpp's quantizer reads: `weight_matrix_bytes`),
  scales and zero points included; norms, biases, router, embedding and MTP's eh_proj stay in
  the activation dtype, but a GGUF file's embedding table (`embedding_format`: quantized as
  llama.cpp writes it). FLOPs do not change; dequantisation is reported as `dequant_ops`.
- Activation bytes are an ESTIMATE (every linear's input read and output written once,
  logits included) and are reported apart: they are not in the roofline's denominator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig, kind_counts
from roofline.model.dtypes import dtype_bytes
from roofline.model.formats import GGUF_FALCON, Format, Precision, gguf_tensor_formats, parse_format, parse_precision

# ---- parameter counts, per module, matching roofline.model.decoder exactly ------------------------

def attention_params(cfg: ModelConfig) -> int:
    h, d = cfg.heads, cfg.d
    if cfg.is_mla:
        qk = cfg.qk_nope_dim + cfg.qk_rope_dim
        q = (d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * qk) if cfg.q_lora_rank else d * h * qk
        kv = d * (cfg.kv_lora_rank + cfg.qk_rope_dim) + cfg.kv_lora_rank
        kv += cfg.kv_lora_rank * h * (cfg.qk_nope_dim + cfg.v_head_dim)
        return q + kv + h * cfg.v_head_dim * d + indexer_params(cfg)
    qkv_out = (h * (2 if cfg.attn_output_gate else 1) + 2 * cfg.kv_heads) * cfg.head_dim  # + the output gate
    p = d * qkv_out + h * cfg.head_dim * d
    p += qkv_out if cfg.qkv_bias else 0
    return p + qk_norm_params(cfg)


def linear_attention_params(cfg: ModelConfig) -> int:
    """One Gated DeltaNet layer (transformers' Qwen3NextGatedDeltaNet): in_proj_qkvz [d -> 2 nk dk + 2 nv dv],
    in_proj_ba [d -> 2 nv], the depthwise causal conv over q, k, v (conv_dim x kernel taps, no bias), A_log and
    dt_bias (nv each), the gated RMSNorm (dv) and out_proj [nv dv -> d]."""
    nk, nv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
    return (cfg.d * (2 * nk * dk + 2 * nv * dv) + cfg.d * 2 * nv + cfg.linear_conv_dim * cfg.linear_conv_kernel
            + 2 * nv + dv + nv * dv * cfg.d)


def mixer_params(cfg: ModelConfig, linear: bool = False) -> int:
    """A layer's token mixer: its attention, or a Gated DeltaNet (`linear`)."""
    return linear_attention_params(cfg) if linear else attention_params(cfg)


def qk_norm_params(cfg: ModelConfig) -> int:
    """The QK-norm's weights: one head's width each for q and k (per_head), or every head's (per_layer)."""
    if not cfg.qk_norm:
        return 0
    if cfg.qk_norm_type == "per_layer":
        return (cfg.heads + cfg.kv_heads) * cfg.head_dim
    return 2 * cfg.head_dim


def indexer_params(cfg: ModelConfig) -> int:
    """The sparse-attention indexer of one layer (0 without): its query projection from the q latent, its key
    projection and LayerNorm (weight and bias), and the per-head weights from the hidden state."""
    if not cfg.is_sparse:
        return 0
    hi, di = cfg.index_heads, cfg.index_head_dim
    return cfg.q_lora_rank * hi * di + cfg.d * di + 2 * di + cfg.d * hi


def attention_matmul_params(cfg: ModelConfig, linear: bool = False) -> int:
    """Attention weights that multiply each token (norm and bias vectors excluded); a Gated DeltaNet's (`linear`):
    its projections and conv taps, not A_log, dt_bias and its norm."""
    if linear:
        return linear_attention_params(cfg) - 2 * cfg.linear_v_heads - cfg.linear_v_dim
    p = attention_params(cfg)
    if cfg.is_mla:
        return p - cfg.kv_lora_rank - cfg.q_lora_rank - (2 * cfg.index_head_dim if cfg.is_sparse else 0)
    p -= (cfg.heads * (2 if cfg.attn_output_gate else 1) + 2 * cfg.kv_heads) * cfg.head_dim if cfg.qkv_bias else 0
    return p - qk_norm_params(cfg)


def expert_params(cfg: ModelConfig) -> int:
    return 3 * cfg.d * cfg.moe_ffn


def moe_fixed_params(cfg: ModelConfig) -> int:
    """Router (+ selection bias) and shared experts: read by every MoE forward."""
    router = cfg.d * cfg.experts + (cfg.experts if cfg.router_scoring == "sigmoid" else 0)
    return router + 3 * cfg.d * cfg.moe_ffn * cfg.shared_experts + (cfg.d if cfg.shared_expert_gate else 0)


def dense_ffn_params(cfg: ModelConfig) -> int:
    """A dense FFN: gate, up and down of a SwiGLU, or up and down of a two-matrix MLP."""
    return cfg.ffn_matrices * cfg.d * cfg.ffn


def block_params(cfg: ModelConfig, moe: bool, linear: bool = False) -> int:
    ffn = moe_fixed_params(cfg) + cfg.experts * expert_params(cfg) if moe else dense_ffn_params(cfg)
    return 2 * cfg.d + mixer_params(cfg, linear) + ffn


def mtp_params(cfg: ModelConfig) -> int:
    """One MTP module's own parameters (embedding and LM head are shared, not counted)."""
    return 3 * cfg.d + 2 * cfg.d * cfg.d + block_params(cfg, cfg.is_moe)


def embedding_params(cfg: ModelConfig) -> int:
    return cfg.vocab * cfg.d


def head_params(cfg: ModelConfig) -> int:
    return 0 if cfg.tie_embeddings else cfg.vocab * cfg.d


def moe_layers(cfg: ModelConfig) -> int:
    return sum(cfg.layer_is_moe(i) for i in range(cfg.layers))


@dataclass(frozen=True)
class ParamCount:
    total: int  # main model, embedding and head included, MTP excluded
    active: int  # per token: total less the routed experts a token does not use
    mtp: int  # all MTP modules' own parameters
    total_with_mtp: int
    active_with_mtp: int
    embedding: int
    matmul_active: int  # weights multiplied per token in the main forward (FLOPs = 2 x this x tokens)


def param_count(cfg: ModelConfig) -> ParamCount:
    n_moe = moe_layers(cfg)
    kinds = cfg.layer_kinds()
    stack = sum(n * block_params(cfg, moe, lin) for (moe, lin), n in kinds.items())
    total = embedding_params(cfg) + head_params(cfg) + stack + cfg.d
    unused = n_moe * (cfg.experts - cfg.experts_per_token) * expert_params(cfg)
    mtp = cfg.mtp_layers * mtp_params(cfg)
    mtp_unused = cfg.mtp_layers * (cfg.experts - cfg.experts_per_token) * expert_params(cfg) if cfg.is_moe else 0
    dense_ffn = dense_ffn_params(cfg)
    moe_ffn_active = (cfg.d * cfg.experts + (cfg.experts_per_token + cfg.shared_experts) * expert_params(cfg)
                      + (cfg.d if cfg.shared_expert_gate else 0))
    matmul = sum(n * attention_matmul_params(cfg, lin) for (_, lin), n in kinds.items()) + cfg.vocab * cfg.d
    matmul += (cfg.layers - n_moe) * dense_ffn + n_moe * moe_ffn_active
    return ParamCount(total=total, active=total - unused, mtp=mtp, total_with_mtp=total + mtp,
                      active_with_mtp=total - unused + mtp - mtp_unused, embedding=embedding_params(cfg),
                      matmul_active=matmul)


SHARDED_MOE_NO_GRAPH = ("the sharded MoE selects each expert's tokens on the host (data-dependent shapes), which "
                        "CUDA-graph capture cannot record")


MOE_NO_STATIC_GRAPH = ("the touched-expert MoE selects each expert's tokens on the host (data-dependent shapes), "
                       "which CUDA-graph capture cannot record and which would break the one-graph-per-kind compiled "
                       "forward at every MoE layer (a recompile per set of experts); its sync-free twin ('grouped': "
                       "one grouped GEMM over the experts' token groups) needs torch's grouped-GEMM kernel, bfloat16 "
                       "on a Hopper or Blackwell GPU (sm90/sm100), and running every expert instead reads all E "
                       "experts at any batch, which no serving engine does")


def moe_impl_for_mode(mode: str, sharded: bool = False, new_run: bool = False, grouped: bool = False) -> str:
    """The one MoE/mode rule: what our decoder runs for MoE in a timing mode, on one device or
    sharded over ranks (roofline.parallel.runner), and so how its rows are priced. Eager routes to the
    touched experts (the routing syncs with the host). In `graph` or `compiled` mode on one device the
    grouped path runs where it captures (`grouped=True`: decoder.grouped_capturable, bfloat16 on an
    sm90/sm100 GPU): the same touched experts, priced as touched. Elsewhere a new sweep (`new_run=True`)
    of an MoE model in those modes is refused (MOE_NO_STATIC_GRAPH); rows measured in them before
    the grouped path ran every expert ("dense") and are priced so. Sharded, the rank's MoE
    (roofline.parallel.sharded) runs touched experts in eager and compiled mode (graph breaks at the
    routing) and graph mode is refused.
    Predictions never price dense experts: serving engines' fused MoE kernels read only the routed
    experts and capture in CUDA graphs, so the what-if (roofline.parallel.whatif) prices touched
    experts in every mode, and a fit whose MoE rows ran dense is applied to the touched accounting
    as a device-fit transfer (roofline.analysis.costmodel.step_model)."""
    if sharded:
        if mode == "graph":
            raise ValueError(f"mode='graph' with tp/ep > 1: {SHARDED_MOE_NO_GRAPH}")
        return "touched"
    if mode == "eager":
        return "touched"
    if grouped:
        return "grouped"
    if new_run:
        raise ValueError(f"mode={mode!r} with an MoE model on one device: {MOE_NO_STATIC_GRAPH}; use modes=[eager]")
    return "dense"


def experts_touched(cfg: ModelConfig, tokens: int, moe_impl: str = "touched") -> float:
    """Expected distinct experts per MoE layer that `tokens` routed tokens touch (uniform routing)."""
    if moe_impl not in ("touched", "dense", "grouped"):
        raise ValueError(f"moe_impl={moe_impl!r}: allowed ('touched', 'dense', 'grouped')")
    if not cfg.is_moe:
        return 0.0
    if moe_impl == "dense":
        return float(cfg.experts)
    E, k = cfg.experts, cfg.experts_per_token
    return E * (1.0 - (1.0 - k / E) ** tokens)


def kv_bytes_per_token(cfg: ModelConfig, dtype) -> int:
    """Cache bytes one token adds across all layers of the main stack (scales included when
    the precision's KV format has per-token scales)."""
    return (cfg.layers - cfg.linear_layers) * kv_token_layer_bytes(cfg, parse_precision(dtype))


def linear_state_layer_bytes(cfg: ModelConfig, act_bytes: int, v_heads: int | None = None) -> int:
    """Bytes a sequence holds in one Gated DeltaNet layer whatever its length: the recurrent state (v_heads x
    linear_k_dim x linear_v_dim in linear_state_dtype) and the causal conv's last kernel - 1 inputs (activation
    dtype); `v_heads`: a rank's share of the heads (its conv channels in proportion). 0 without such layers."""
    if not cfg.full_attention_interval:
        return 0
    nv = cfg.linear_v_heads if v_heads is None else v_heads
    sb = dtype_bytes(cfg.linear_state_dtype) if cfg.linear_state_dtype else act_bytes
    conv = cfg.linear_conv_dim * nv // cfg.linear_v_heads * (cfg.linear_conv_kernel - 1)
    return nv * cfg.linear_k_dim * cfg.linear_v_dim * sb + conv * act_bytes


def linear_state_bytes_per_seq(cfg: ModelConfig, dtype) -> int:
    """Bytes each sequence holds in the main stack's Gated DeltaNet layers, whatever its length."""
    return cfg.linear_layers * linear_state_layer_bytes(cfg, parse_precision(dtype).act_bytes)


def linear_flops_per_token(cfg: ModelConfig, q: int, v_heads: int | None = None) -> float:
    """FLOPs of one Gated DeltaNet layer's recurrence per token (its projections and conv are matmul work):
    a decode step (q = 1, the recurrent form) decays the state, reads k's memory from it, writes the delta and reads
    the output, ~8 dk dv a head; a longer pass runs the chunked form (FLA's chunk_gated_delta_rule, chunks of
    C = 64): per head and token 2C(3dk + 2dv) for the intra-chunk products and the WY transform and 6 dk dv for the
    state's part."""
    if not cfg.full_attention_interval:
        return 0.0
    nv = cfg.linear_v_heads if v_heads is None else v_heads
    dk, dv = cfg.linear_k_dim, cfg.linear_v_dim
    per_head = 8 * dk * dv if q == 1 else 2 * 64 * (3 * dk + 2 * dv) + 6 * dk * dv
    return float(nv * per_head)


def block_elementwise_elements(cfg: ModelConfig, moe: bool, linear: bool = False) -> float:
    """Elements one token moves through DRAM in one block's kernels that are neither a GEMM nor attention nor a
    routed expert (expert_pair_io_bytes), as vLLM runs them (csrc/layernorm_kernels.cu, activation_kernels.cu,
    pos_encoding_kernels.cu through vllm/_custom_ops.py): two fused residual-add + RMSNorms, each reading the
    hidden state and the residual and writing both back in place (4 d); SiluAndMul over each SwiGLU's gate/up
    output (silu_and_mul(out [.., F], input [.., 2F]): read 2F, write F; the dense FFN's or the shared expert's; a
    two-matrix MLP's activation (gelu) reads F and writes F);
    rotary_embedding in place on the query and key heads (read and write (heads + kv_heads) x head_dim; MLA: the
    rope part of every query head and the one shared rope key, plus the RMSNorms of the q and kv latents). A Gated
    DeltaNet layer: the norms and its FFN only (its conv and gating are not counted). Multiply by the activation
    bytes. Assumption: the other engines move the same bytes (TensorRT-LLM, which fuses the rotary into its
    attention kernel, moves less; the rotary's share is small)."""
    d = cfg.d
    n = 2 * 4 * d
    act = 3 if cfg.ffn_gated or moe else 2  # a gated activation reads 2F and writes F; GELU reads F and writes F
    n += act * sum(N for name, N, _ in block_matrices(cfg, moe, linear) if name.endswith(".w1"))
    if linear:
        return float(n)
    if cfg.is_mla:
        n += 2 * (cfg.heads * cfg.qk_rope_dim + cfg.qk_rope_dim) + 2 * (cfg.q_lora_rank + cfg.kv_lora_rank)
    else:
        n += 2 * (cfg.heads + cfg.kv_heads) * cfg.head_dim
    return float(n)


# ---- quantized formats: which matrices take the weight format, and their exact bytes ---------------

def block_matrices(cfg: ModelConfig, moe: bool, linear: bool = False) -> list[tuple[str, int, int]]:
    """(name, N, K) of the linears of one block that take the weights format (W[N, K]); routed
    experts apart (`expert_matrices`). Norms, biases and the MoE router stay in the activation
    dtype, and so does MLA's kv_b: the absorbed attention multiplies by its halves directly,
    which is why serving engines hold it dequantised (vLLM does at load). A sparse-attention
    indexer's query and key projections take the format; its head weights do not (DeepSeek-V3.2's
    release and SGLang's indexer: 'weight_proj is not quantized'). A Gated DeltaNet layer (`linear`): its in_proj_qkvz,
    in_proj_ba and out_proj (its conv, A_log, dt_bias and norm in the activation dtype)."""
    d = cfg.d
    if linear:
        nk, nv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
        attn = [("attn.in_proj_qkvz", 2 * nk * dk + 2 * nv * dv, d), ("attn.in_proj_ba", 2 * nv, d),
                ("attn.out_proj", d, nv * dv)]
    elif cfg.is_mla:
        qk = cfg.qk_nope_dim + cfg.qk_rope_dim
        attn = ([("attn.q_a", cfg.q_lora_rank, d), ("attn.q_b", cfg.heads * qk, cfg.q_lora_rank)]
                if cfg.q_lora_rank else [("attn.q_proj", cfg.heads * qk, d)])
        attn += [("attn.kv_a", cfg.kv_lora_rank + cfg.qk_rope_dim, d), ("attn.wo", d, cfg.heads * cfg.v_head_dim)]
        if cfg.is_sparse:
            attn += [("attn.idx_wq_b", cfg.index_heads * cfg.index_head_dim, cfg.q_lora_rank),
                     ("attn.idx_wk", cfg.index_head_dim, d)]
    else:
        q_out = cfg.heads * (2 if cfg.attn_output_gate else 1)  # + the output gate's rows
        attn = [("attn.wqkv", (q_out + 2 * cfg.kv_heads) * cfg.head_dim, d), ("attn.wo", d, cfg.heads * cfg.head_dim)]
    swiglu = lambda p, f: [(f"{p}.w1", f, d), (f"{p}.w3", f, d), (f"{p}.w2", d, f)]  # noqa: E731
    if not moe:
        return attn + (swiglu("ffn", cfg.ffn) if cfg.ffn_gated else [("ffn.w1", cfg.ffn, d), ("ffn.w2", d, cfg.ffn)])
    return attn + (swiglu("ffn.shared", cfg.moe_ffn * cfg.shared_experts) if cfg.shared_experts else [])


def expert_matrices(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    return [("ffn.w1", cfg.moe_ffn, cfg.d), ("ffn.w3", cfg.moe_ffn, cfg.d), ("ffn.w2", cfg.d, cfg.moe_ffn)]


def check_weight_format(cfg: ModelConfig, prec: Precision) -> None:
    """ConfigError when the weights format cannot hold this model's matrices: an int4 group
    size that does not divide a linear's K (names the first such matrix). The LM head's format
    is checked the same way against d."""
    mats = [m for moe, lin in cfg.layer_kinds() for m in block_matrices(cfg, moe, lin)]
    experts = expert_matrices(cfg) if cfg.is_moe else []
    for cls, fmt, shapes in (("weights", prec.weights, mats), ("experts", prec.experts, experts),
                             ("lm_head", prec.lm_head, [("lm_head", cfg.vocab, cfg.d)])):
        if fmt.kind == "int4" and fmt.group:
            bad = [(name, K) for name, _, K in shapes if K % fmt.group]
            if bad:
                raise ConfigError(f"{cls}={fmt.name}: the group size {fmt.group} does not divide K={bad[0][1]} of "
                                  f"{cfg.name}'s {bad[0][0]} (a group must divide every K; try a smaller group)")


GGUF_ROLES = {"attn.wo": "attn_output", "attn.q_proj": "attn_q", "attn.q_a": "attn_q", "attn.q_b": "attn_q",
              "ffn.w2": "ffn_down", "ffn.shared.w2": "ffn_down"}  # a matrix's tensor role in a GGUF file


def weight_matrix_bytes(cfg: ModelConfig, fmt: Format, name: str, N: int, K: int, act_bytes: int) -> int:
    """Bytes of the block (or routed expert) matrix `name` ([N, K], accounting.block_matrices' names, or an engine's
    merged pair) of `cfg` in the weights format `fmt`: fmt.matrix_bytes, except in a GGUF file, whose quantizer gives
    some tensor roles more bits (formats.gguf_tensor_formats: Q4_K_M's attn_v and ffn_down, Mixtral's attn_k and
    attn_v), each priced at its formats' shares of the layers; a fused wqkv by its q, k and v rows (one attn_qkv
    tensor on Falcon)."""
    if fmt.family != "ggml":
        return fmt.matrix_bytes(N, K, act_bytes)

    def role_bytes(role: str, rows: int) -> float:
        return sum(share * f.matrix_bytes(rows, K, act_bytes) for f, share in gguf_tensor_formats(fmt, role, cfg))
    if name == "attn.wqkv" and cfg.architecture not in GGUF_FALCON:
        kv = cfg.kv_heads * cfg.head_dim
        return round(role_bytes("attn_q", N - 2 * kv) + role_bytes("attn_k", kv) + role_bytes("attn_v", kv))
    role = "attn_qkv" if name == "attn.wqkv" else GGUF_ROLES.get(name, "other")
    return round(role_bytes(role, N))


def block_vector_bytes(cfg: ModelConfig, moe: bool, act_bytes: int, linear: bool = False) -> int:
    """Bytes of one block's weights outside its matrices (block_matrices): norms, biases, the router and the like,
    in the activation dtype."""
    params = 2 * cfg.d + mixer_params(cfg, linear) + (moe_fixed_params(cfg) if moe else dense_ffn_params(cfg))
    return (params - sum(N * K for _, N, K in block_matrices(cfg, moe, linear))) * act_bytes


def block_weight_bytes(cfg: ModelConfig, moe: bool, prec: Precision, linear: bool = False) -> int:
    """Bytes of one block's weights, routed experts excluded (`linear`: a Gated DeltaNet block)."""
    a = prec.act_bytes
    return block_vector_bytes(cfg, moe, a, linear) + sum(weight_matrix_bytes(cfg, prec.weights, name, N, K, a)
                                                         for name, N, K in block_matrices(cfg, moe, linear))


def expert_bytes(cfg: ModelConfig, prec: Precision) -> int:
    """Bytes of one routed expert."""
    return sum(weight_matrix_bytes(cfg, prec.experts, name, N, K, prec.act_bytes)
               for name, N, K in expert_matrices(cfg))


def expert_pair_io_bytes(d: int, moe_ffn: int, a_in: float, a: int) -> float:
    """DRAM bytes one routed (token, expert) pair moves beside the expert's weights in a grouped MoE layer, as
    vLLM's fused_experts runs it (fused_moe.py: intermediate_cache1 (M, top_k, N), intermediate_cache2
    (M * top_k, N // 2), intermediate_cache3 (M, top_k, K), then moe_sum): the gate/up GEMM reads the token's row
    (d x a_in: the GEMM's input dtype, 1 B for fp8 w8a8), writes its 2F outputs, which the activation kernel reads
    (2F x a each way) and writes back as F inputs of the down GEMM (F x a_in each way), whose d outputs are written
    and read back by the top-k sum (d x a each way). F is the rank's shard of the expert's hidden width. Per token
    (not per pair, left out): the input's quantization and the summed output. Small beside the experts' weights at
    decode (a few percent at 64 sequences); at a prefill chunk with a narrow shard (DeepSeek-V3 at TP 8: F = 256,
    d = 7168) it exceeds them: d x (a_in + 2a) + F x (4a + 2 a_in)."""
    return d * (a_in + 2 * a) + moe_ffn * (4 * a + 2 * a_in)


def embedding_format(cfg: ModelConfig, prec: Precision) -> Format:
    """The embedding table's format: the activation dtype, except in a GGUF file (weights in a ggml format), whose
    token_embd llama.cpp's quantizer writes in the file's own type, or by the output tensor's rules where the model
    ties the two (src/llama-quant.cpp, llama_tensor_get_type: '!qs.has_output && name == token_embd' takes the
    output's branch; untied, token_embd keeps the default type but for the IQ1/IQ2/IQ3/TQ file types, not priced):
    the precision's LM-head format then (formats.gguf_output_format, Q6_K or Q8_0, or lm_head= as given)."""
    if prec.weights.family == "ggml":
        return prec.lm_head if cfg.tie_embeddings else prec.weights
    return parse_format(prec.activations)


def embedding_bytes(cfg: ModelConfig, prec: Precision, rows: int | None = None) -> int:
    """Bytes of `rows` rows of the embedding table (None: the whole table, cfg.vocab rows) in its format."""
    return embedding_format(cfg, prec).matrix_bytes(cfg.vocab if rows is None else rows, cfg.d, prec.act_bytes)


def head_bytes(cfg: ModelConfig, prec: Precision) -> int:
    """The LM head read by a forward: its format, or the embedding table's (embedding_format) when tied."""
    if cfg.tie_embeddings:
        return embedding_bytes(cfg, prec)
    return prec.lm_head.matrix_bytes(cfg.vocab, cfg.d, prec.act_bytes)


def resident_weight_bytes(cfg: ModelConfig, dtype, with_mtp: bool = True) -> int:
    """Every weight held in memory (embedding table included; MTP modules when asked)."""
    prec = parse_precision(dtype)
    a = prec.act_bytes
    stack = sum(n * block_weight_bytes(cfg, moe, prec, lin) for (moe, lin), n in cfg.layer_kinds().items())
    stack += moe_layers(cfg) * cfg.experts * expert_bytes(cfg, prec)
    total = embedding_bytes(cfg, prec) + (0 if cfg.tie_embeddings else head_bytes(cfg, prec)) + stack + cfg.d * a
    if with_mtp and cfg.mtp_layers:
        one = (3 * cfg.d + 2 * cfg.d * cfg.d) * a + block_weight_bytes(cfg, cfg.is_moe, prec)
        one += cfg.experts * expert_bytes(cfg, prec) if cfg.is_moe else 0
        total += cfg.mtp_layers * one
    return total


def kv_token_layer_bytes(cfg: ModelConfig, prec: Precision) -> int:
    """Bytes one token adds to one layer's cache: GQA keeps K and V per KV head, MLA one latent (+ the
    sparse-attention indexer's key, a cache tensor of its own: its per-token scale apart)."""
    if cfg.is_sparse:
        return sum(kv_split_token_bytes(cfg, prec))
    heads = 1 if cfg.is_mla else 2 * cfg.kv_heads
    return prec.kv.kv_token_bytes(cfg.kv_elems_per_token_layer, heads, prec.act_bytes)


def kv_split_token_bytes(cfg: ModelConfig, prec: Precision) -> tuple[int, int]:
    """(attended, indexed) bytes one token adds to one layer's cache: what attention reads of an attended position
    (every cache element but the indexer's key) and the indexer's key, which the indexer reads at every position
    (0 without sparse attention)."""
    if not cfg.is_sparse:
        return kv_token_layer_bytes(cfg, prec), 0
    a = prec.act_bytes
    return (prec.kv.kv_token_bytes(cfg.kv_lora_rank + cfg.qk_rope_dim, 1, a),
            prec.kv.kv_token_bytes(cfg.index_head_dim, 1, a))


def kv_read_bytes_per_seq_layer(cfg: ModelConfig, attended: float, indexed: float, kv_len: float, q: int) -> float:
    """Cache bytes one sequence's step of q tokens reads in one layer (the layers' mean) over kv_len positions:
    `attended` bytes at each position its attention reads (ModelConfig.attended_positions: every held one, a window,
    or a sparse layer's selected ones) and a sparse indexer's key (`indexed` bytes) at every position
    (kv_split_token_bytes gives the two)."""
    return attended * cfg.attended_positions(kv_len, q) + indexed * kv_len


def indexer_flops(cfg: ModelConfig, layers: int, seqs: float, L: float, q: int) -> float:
    """FLOPs of a sparse-attention indexer's logits for `seqs` sequences of q new tokens after L cached ones over
    `layers` layers: 2 x its heads x head dim per scored (query, key) pair, every key up to each query (0 without
    sparse attention). Its heads are replicated on every rank (vLLM and SGLang hold the indexer whole)."""
    return 2.0 * cfg.index_heads * cfg.index_head_dim * layers * seqs * cfg.indexer_pairs(L, q)


def kv_cache_tensors_per_layer(cfg: ModelConfig) -> int:
    """Cache tensors of one attention layer (per-tensor scales): K and V; MLA's latent (+ a sparse indexer's keys)."""
    return (2 if cfg.is_sparse else 1) if cfg.is_mla else 2


@dataclass(frozen=True)
class ForwardCost:
    """Bytes and FLOPs of one forward of q tokens per sequence for B sequences at context L."""
    B: int
    q: int
    L: int
    kv_len: int
    tokens: int
    weight_bytes: float  # dense weights + touched experts (+ LM head)
    expert_bytes: float  # the routed-expert part of weight_bytes
    experts_touched: float  # per MoE layer
    kv_read_bytes: int
    kv_write_bytes: int
    embed_bytes: int  # the gathered embedding rows
    activation_bytes_est: int  # estimate, not in bytes_total
    flops_matmul: int
    flops_attention: int
    mask_bytes: int = 0  # an attention mask the forward built and read (the model's last_mask_bytes)
    dequant_ops: float = 0.0  # weight elements x element operations to dequantise them (not FLOPs)

    @property
    def bytes_total(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.embed_bytes + self.mask_bytes

    @property
    def flops(self) -> int:
        return self.flops_matmul + self.flops_attention

    @property
    def intensity(self) -> float:
        """FLOP per byte of HBM/DRAM traffic."""
        return self.flops / self.bytes_total

    def as_row(self) -> dict:
        row = asdict(self)
        row.update(bytes_total=self.bytes_total, flops=self.flops, intensity=self.intensity)
        return row


def _attention_dims(cfg: ModelConfig) -> tuple[int, int]:
    if cfg.is_mla:
        return cfg.kv_lora_rank + cfg.qk_rope_dim, cfg.kv_lora_rank
    return cfg.head_dim, cfg.head_dim


def _linear_io(cfg: ModelConfig, moe: bool, linear: bool = False) -> int:
    """Elements one token's activations cross the linears of one block: inputs + outputs."""
    if linear:  # a Gated DeltaNet: in_proj_qkvz, in_proj_ba, out_proj
        nk, nv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
        attn = cfg.d + 2 * nk * dk + 2 * nv * dv + cfg.d + 2 * nv + nv * dv + cfg.d
    elif cfg.is_mla:
        qk, r = cfg.qk_nope_dim + cfg.qk_rope_dim, cfg.kv_lora_rank
        q_io = cfg.d + cfg.q_lora_rank * 2 + cfg.heads * qk if cfg.q_lora_rank else cfg.d + cfg.heads * qk
        attn = q_io + cfg.d + r + cfg.qk_rope_dim + cfg.heads * cfg.v_head_dim + cfg.d
        if cfg.is_sparse:  # the indexer's projections: q latent -> its queries, hidden -> its key and head weights
            hi, di = cfg.index_heads, cfg.index_head_dim
            attn += cfg.q_lora_rank + hi * di + cfg.d + di + cfg.d + hi
    else:
        q_out = cfg.heads * (2 if cfg.attn_output_gate else 1)
        attn = cfg.d + (q_out + 2 * cfg.kv_heads) * cfg.head_dim + cfg.heads * cfg.head_dim + cfg.d
    swiglu = lambda width: 2 * cfg.d + 3 * width + cfg.d  # w1, w3 in; w1, w3 out; w2 in; w2 out
    if not moe:
        return attn + (swiglu(cfg.ffn) if cfg.ffn_gated else cfg.d + 2 * cfg.ffn + cfg.d)  # w1 in, out; w2 in, out
    ffn = cfg.d + cfg.experts + cfg.experts_per_token * swiglu(cfg.moe_ffn)
    return attn + ffn + (swiglu(cfg.moe_ffn * cfg.shared_experts) if cfg.shared_experts else 0)


def _stack_cost(cfg: ModelConfig, kinds: dict[tuple[bool, bool], int], B: int, q: int, L: int, kv_len: int,
                prec: Precision, moe_impl: str, touched: float | None) -> dict:
    """Shared by the main forward and an MTP module (a one-block stack); kinds: {(MoE, linear attention): blocks}."""
    N = B * q
    b = prec.act_bytes
    layers, n_moe, n_lin = kind_counts(kinds)
    touched = experts_touched(cfg, N, moe_impl) if touched is None else touched
    n_dense = layers - n_moe
    dense_b = sum(n * block_weight_bytes(cfg, moe, prec, lin) for (moe, lin), n in kinds.items())
    expert_b = n_moe * touched * expert_bytes(cfg, prec)
    quantized = sum(n * sum(r * k for _, r, k in block_matrices(cfg, moe, lin)) for (moe, lin), n in kinds.items())
    dequant = quantized * prec.weights.dequant_ops_per_weight()
    dequant += n_moe * touched * expert_params(cfg) * prec.experts.dequant_ops_per_weight()
    head_fmt = embedding_format(cfg, prec) if cfg.tie_embeddings else prec.lm_head
    dequant += cfg.vocab * cfg.d * head_fmt.dequant_ops_per_weight()
    d_qk, d_v = _attention_dims(cfg)
    attended = cfg.attended_pairs(L, q)  # a windowed layer attends at most its window; a sparse one index_topk
    flops_attn = 2 * (d_qk + d_v) * cfg.heads * layers * B * attended
    flops_attn += indexer_flops(cfg, layers, B, L, q)
    flops_attn += n_lin * N * linear_flops_per_token(cfg, q)  # Gated DeltaNet recurrences
    gate = cfg.d if cfg.shared_expert_gate else 0
    moe_active = cfg.d * cfg.experts + (cfg.experts_per_token + cfg.shared_experts) * expert_params(cfg) + gate
    if moe_impl == "dense":
        moe_active = cfg.d * cfg.experts + (cfg.experts + cfg.shared_experts) * expert_params(cfg) + gate
    matmul = sum(n * attention_matmul_params(cfg, lin) for (_, lin), n in kinds.items())
    matmul += n_dense * dense_ffn_params(cfg) + n_moe * moe_active
    matmul += cfg.vocab * cfg.d  # LM head
    kv_tok = kv_token_layer_bytes(cfg, prec)
    kv_att, kv_idx = kv_split_token_bytes(cfg, prec)  # a sparse layer reads its index keys at every position
    kv_fixed = (layers - n_lin) * prec.kv.kv_layer_fixed_bytes(b, tensors=kv_cache_tensors_per_layer(cfg))
    act_per_token = (sum(n * _linear_io(cfg, moe, lin) for (moe, lin), n in kinds.items()) + cfg.d + cfg.vocab) * b
    state = B * n_lin * linear_state_layer_bytes(cfg, b)  # read and written back once a pass
    return dict(
        weight_bytes=dense_b + cfg.d * b + head_bytes(cfg, prec) + expert_b,
        expert_bytes=expert_b, experts_touched=touched,
        kv_read_bytes=B * layers * kv_read_bytes_per_seq_layer(cfg, kv_att, kv_idx, kv_len, q) + kv_fixed + state,
        kv_write_bytes=B * (layers - n_lin) * kv_tok * q + state,
        embed_bytes=embedding_bytes(cfg, prec, N), activation_bytes_est=N * act_per_token,
        flops_matmul=2 * matmul * N, flops_attention=flops_attn, dequant_ops=float(dequant))


KV_IMPLS = ("float", "dequant")


def kv_dequant_bytes(cfg: ModelConfig, prec: Precision, B: int, layers: int, kv_len: int) -> int:
    """The activation-dtype copy a dequantise-per-step KV path (roofline.model.kvcache.KV_IMPL)
    writes and attention then reads, beyond the codes and scales: 2 x elements x act bytes per
    cached position and layer; 0 for a float cache."""
    if prec.kv.is_float:
        return 0
    return 2 * B * layers * kv_len * cfg.kv_elems_per_token_layer * prec.act_bytes


def _with_kv_impl(c: dict, cfg: ModelConfig, prec: Precision, B: int, layers: int, kv_len: int, kv_impl: str,
                  q: int = 1) -> dict:
    if kv_impl not in KV_IMPLS:
        raise ValueError(f"kv_impl={kv_impl!r}: allowed {KV_IMPLS}")
    if kv_impl == "dequant" and not prec.kv.is_float:  # priced as what it moved: the codes, then the dequantised copy
        c["kv_read_bytes"] += kv_dequant_bytes(cfg, prec, B, layers, kv_len)
        if cfg.is_sparse:  # which dequantises every position's codes, not only the ones sparse attention gathers
            c["kv_read_bytes"] += (B * layers * kv_split_token_bytes(cfg, prec)[0]
                                   * (kv_len - cfg.attended_positions(kv_len, q)))
    return c


def forward_cost(cfg: ModelConfig, dtype, B: int, q: int, L: int, kv_len: int | None = None,
                 moe_impl: str = "touched", touched: float | None = None, kv_impl: str = "float") -> ForwardCost:
    """Cost of `Transformer.forward` on q new tokens for B sequences with L cached tokens each.

    touched: experts per MoE layer actually run (the model's `last_touched`, averaged over
    layers); default: the uniform-routing expectation U(B·q). kv_impl: how attention read a
    quantized cache ("float": the codes as a fused kernel reads them; "dequant": the codes plus
    the dequantised copy, what this decoder's path moves, in kv_read_bytes).
    """
    _check_shape(cfg, B, q, L)
    kv_len = L + q if kv_len is None else kv_len
    prec = parse_precision(dtype)
    c = _stack_cost(cfg, cfg.layer_kinds(), B, q, L, kv_len, prec, moe_impl, touched)
    c = _with_kv_impl(c, cfg, prec, B, cfg.layers - cfg.linear_layers, kv_len, kv_impl, q)  # Gated DeltaNet: no KV
    return ForwardCost(B=B, q=q, L=L, kv_len=kv_len, tokens=B * q, **c)


def mtp_cost(cfg: ModelConfig, dtype, B: int, q: int, L: int, kv_len: int | None = None,
             moe_impl: str = "touched", touched: float | None = None, kv_impl: str = "float") -> ForwardCost:
    """Cost of one `Transformer.mtp_forward` (one MTP module over q positions)."""
    prec, kv_len = mtp_args(cfg, dtype, B, q, L, kv_len)
    c = _with_kv_impl(_stack_cost(cfg, {(cfg.is_moe, False): 1}, B, q, L, kv_len, prec, moe_impl, touched),
                      cfg, prec, B, 1, kv_len, kv_impl, q)
    return ForwardCost(B=B, q=q, L=L, kv_len=kv_len, tokens=B * q, **add_mtp_own_cost(c, cfg, prec.act_bytes, B * q))


def mtp_args(cfg: ModelConfig, dtype, B: int, q: int, L: int, kv_len: int | None) -> tuple[Precision, int]:
    """(precision, kv_len) of one MTP forward, its shape checked (ValueError without an MTP module)."""
    if cfg.mtp_layers < 1:
        raise ConfigError(f"model {cfg.name!r} has no MTP module (mtp_layers=0)")
    _check_shape(cfg, B, q, L)
    return parse_precision(dtype), L + q if kv_len is None else kv_len


def add_mtp_own_cost(c: dict, cfg: ModelConfig, act_bytes: int, tokens: int) -> dict:
    """Adds to a one-block cost what an MTP module has beyond its block, final norm and the shared
    head: enorm and hnorm, and eh_proj (2d -> d, activation dtype) applied to `tokens` positions."""
    c["weight_bytes"] += (2 * cfg.d + 2 * cfg.d * cfg.d) * act_bytes
    c["flops_matmul"] += 2 * 2 * cfg.d * cfg.d * tokens
    return c


def _check_shape(cfg: ModelConfig, B: int, q: int, L: int) -> None:
    for name, v, lo in (("B", B, 1), ("q", q, 1), ("L", L, 0)):
        if not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name}={v!r}: must be an integer >= {lo}")
    if L + q > cfg.max_context:
        raise ConfigError(f"L + q = {L + q}: exceeds model.max_context={cfg.max_context} of {cfg.name!r}")
