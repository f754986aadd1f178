"""Quantized formats: the bytes the byte model charges are the bytes the packed tensors hold,
round-to-nearest stays within each format's bound, the packed int8/int4 kernels compute the
dequantised matmul, and combinations without a fast kernel fail naming format and device."""

import dataclasses

import pytest
import torch

from roofline.model.accounting import (embedding_bytes, embedding_format, forward_cost, head_bytes, param_count,
                                       resident_weight_bytes)
from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.decoder import build_model
from roofline.model.formats import GGML, gguf_more_bits, gguf_tensor_formats, parse_format, parse_precision, precision
from roofline.model.presets import get_preset, scaled_down
from roofline.model import quant
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Setting, WhatIf, capacity, memory_check, sequence_cap

WEIGHT_FORMATS = ["int8", "int4_g32", "int4_g64", "fp8", "fp8_channel", "fp8_e4m3_b128", "fp8_e5m2_b128",
                  "fp8_e4m3_b64x32"]
FAST_CPU = ["int8", "int4_g32", "int4_g64"]


def weight(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16).float()


def layer(w, fmt):
    return quant.packed_linear(w, fmt, reference=fmt.kind == "fp8")


@pytest.mark.parametrize("name", WEIGHT_FORMATS)
def test_format_bytes_equal_the_packed_tensors_held(name):
    fmt = parse_format(name)
    N, K = (200, 320) if fmt.kind == "fp8" else (96, 256)  # fp8 blocks: ragged edges in both dims
    lin = layer(weight(N, K), fmt)
    assert lin.held_bytes() == fmt.matrix_bytes(N, K, act_bytes=2)


def test_int4_bytes_per_weight_include_scales_and_zero_points():
    g32, g128 = parse_format("int4_g32"), parse_format("int4_g128")
    assert g32.matrix_bytes(4096, 4096, 2) / 4096**2 == 0.5 + 2 * 2 / 32
    assert g128.matrix_bytes(4096, 4096, 2) / 4096**2 == 0.5 + 2 * 2 / 128
    assert parse_format("fp8_e4m3_b128").matrix_bytes(4096, 4096, 2) == 4096**2 + 4 * 32 * 32


@pytest.mark.parametrize("name", ["int8", "int4_g32", "int4_g128", "fp8", "fp8_channel", "fp8_e4m3_b128",
                                  "fp8_e5m2"])
def test_quantise_dequantise_error_within_the_format_bound(name):
    fmt = parse_format(name)
    w = weight(160, 384, seed=3)
    w[0, :5] = torch.tensor([0.0, 1e-6, -3.0, 2.5, 1e-3])  # zeros, tiny values and outliers
    qz = quant.quantize(w, fmt)
    ratio = (qz.dequantize() - w).abs() / quant.error_bound(qz)
    assert ratio.max() <= 1.0
    assert ratio.max() > 0.3  # the bound is a real one, not a loose guess


@pytest.mark.parametrize("name", FAST_CPU)
@pytest.mark.parametrize("M", [1, 5, 33])
def test_packed_forward_matches_a_dequantised_float_reference(name, M):
    fmt = parse_format(name)
    w = weight(96, 256, seed=1)
    qz = quant.quantize(w, fmt)
    lin = quant.packed_linear(w, fmt)
    x = torch.randn(M, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = lin(x).float()
    ref = x.double() @ qz.dequantize().double().T
    scale = x.double().abs() @ qz.dequantize().double().abs().T
    assert ((y.double() - ref).abs() <= 2 ** -7 * scale + 1e-6).all()


def test_int8_and_int4_differ_from_the_float_weights_by_their_rounding():
    """The packed layer is not secretly running the float weights: its error vs the unquantised
    matmul matches the quantisation error of its format."""
    w = weight(96, 256, seed=4)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    exact = x.float() @ w.T
    errs = {n: (quant.packed_linear(w, parse_format(n))(x).float() - exact).abs().mean().item()
            for n in ("int8", "int4_g32")}
    assert errs["int4_g32"] > 4 * errs["int8"] > 0


def tiny():
    return get_preset("tiny")


@pytest.mark.parametrize("weights", ["int8", "int4_g32"])
def test_quantized_model_holds_the_bytes_the_accounting_charges(weights):
    cfg = tiny()
    prec = precision("bfloat16", weights, lm_head=weights)
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16, precision=prec)
    assert quant.held_weight_bytes(m) == resident_weight_bytes(cfg, prec, with_mtp=True)
    assert resident_weight_bytes(cfg, prec) < resident_weight_bytes(cfg, "bfloat16")


def test_fp8_block_model_holds_the_bytes_the_accounting_charges():
    cfg = tiny()
    prec = precision("bfloat16", "fp8_e4m3_b32")
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16)
    quant.quantize_model(m, prec, "cpu", reference=True)
    assert quant.held_weight_bytes(m) == resident_weight_bytes(cfg, prec, with_mtp=True)


def test_plain_precision_bytes_are_the_parameter_bytes():
    cfg = scaled_down(get_preset("deepseek-v3"))
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16)
    assert quant.held_weight_bytes(m) == resident_weight_bytes(cfg, "bfloat16") == 2 * param_count(cfg).total_with_mtp


def test_step_weight_bytes_follow_the_format_and_flops_do_not():
    cfg = get_preset("cpu-demo")
    bf, i4 = forward_cost(cfg, "bfloat16", 1, 1, 128), forward_cost(cfg, "bfloat16+weights=int4_g128", 1, 1, 128)
    head = cfg.vocab * cfg.d * 2  # LM head stays bf16
    quantized = bf.weight_bytes - head - 2 * cfg.d * (2 * cfg.layers + 1)  # all but head and norms
    assert i4.weight_bytes - head - 2 * cfg.d * (2 * cfg.layers + 1) == pytest.approx(quantized * 0.53125 / 2)
    assert i4.flops == bf.flops and i4.dequant_ops == 3 * quantized / 2 and bf.dequant_ops == 0
    assert i4.kv_read_bytes == bf.kv_read_bytes


def test_kv_format_cost_is_its_codes_plus_its_scales():
    cfg = tiny()
    bf = forward_cost(cfg, "bfloat16", 2, 1, 64)
    fp8, int8 = forward_cost(cfg, "bfloat16+kv=fp8_e4m3", 2, 1, 64), forward_cost(cfg, "bfloat16+kv=int8", 2, 1, 64)
    assert fp8.kv_read_bytes == bf.kv_read_bytes / 2 + cfg.layers * 2 * 4  # + K and V scales per layer
    tokens_read = 2 * 65 * cfg.layers
    assert int8.kv_read_bytes == bf.kv_read_bytes / 2 + tokens_read * 2 * cfg.kv_heads * 4  # a scale per token per head
    mla = scaled_down(get_preset("deepseek-v3"))
    assert (forward_cost(mla, "bfloat16+kv=fp8", 1, 1, 8).kv_read_bytes
            == forward_cost(mla, "bfloat16", 1, 1, 8).kv_read_bytes / 2 + mla.layers * 4)  # one latent cache, one scale


def test_quantized_tiny_model_tracks_its_float_twin():
    cfg = tiny()
    toks = torch.randint(0, cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    start = torch.zeros(2, dtype=torch.long)
    ref = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16)(toks, start).float()
    q = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, precision="bfloat16+weights=int8")
    out = q(toks, start).float()
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert 0.99 < cos < 1.0  # close, and not bit-identical: quantization changes outputs


def test_fp8_on_cpu_is_unsupported_naming_format_and_device():
    m = build_model(tiny(), max_batch=1, max_context=16, dtype=torch.bfloat16)
    with pytest.raises(quant.Unsupported, match=r"weights=fp8_e4m3_b128 on device=cpu"):
        quant.quantize_model(m, "bfloat16+weights=fp8_e4m3_b128", "cpu")


def test_reference_layers_are_refused_for_timing():
    m = build_model(tiny(), max_batch=1, max_context=16, dtype=torch.bfloat16)
    quant.quantize_model(m, "bfloat16+weights=fp8", "cpu", reference=True)
    with pytest.raises(quant.Unsupported, match=r"weights=fp8_e4m3 on device=cpu.*dequantise-then-matmul"):
        quant.require_fast(m, "bfloat16+weights=fp8", "cpu")


def test_fp8_experts_on_cpu_are_unsupported_naming_format_and_device():
    moe = build_model(scaled_down(get_preset("mixtral-8x7b")), max_batch=1, max_context=16, dtype=torch.bfloat16)
    with pytest.raises(quant.Unsupported, match=r"weights=fp8_e4m3 on device=cpu: no fast kernel"):
        quant.quantize_model(moe, "bfloat16+weights=fp8", "cpu")


def test_int4_group_that_does_not_divide_k_names_format_and_device():
    m = build_model(tiny(), max_batch=1, max_context=16, dtype=torch.bfloat16)
    with pytest.raises(quant.Unsupported, match=r"weights=int4_g128 on device=cpu: K=64"):
        quant.quantize_model(m, "bfloat16+weights=int4_g128", "cpu")


def test_int4_rows_the_cpu_packing_cannot_take_name_format_and_device():
    with pytest.raises(quant.Unsupported, match=r"weights=int4_g32 on device=cpu: N=40 output rows"):
        quant.packed_linear(weight(40, 64), parse_format("int4_g32"))


@pytest.mark.parametrize("bad, field", [("int3", "weights='int3'"), ("int4_g100", "group size 100"),
                                        ("fp8_b0", "fp8 granularity"), ("fp8_channel", "kv='fp8_channel'")])
def test_bad_format_names_fail_naming_field_and_allowed(bad, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        parse_format(bad, "kv" if field.startswith("kv") else "weights")


def test_precision_label_round_trips_and_native_picks_the_release_format():
    p = precision("bf16", "int4_g128", "fp8")
    assert p.label == "bfloat16+weights=int4_g128+kv=fp8_e4m3" and parse_precision(p.label) == p
    assert parse_precision("float32").is_plain and parse_precision("float32").label == "float32"
    ds = get_preset("deepseek-v3")
    assert precision("bfloat16", "native", native=ds.native_weights).weights.name == "fp8_e4m3_b128"
    assert precision("bfloat16", "native", native=get_preset("llama-3.1-70b").native_weights).is_plain


def test_sweep_times_int8_rows_and_records_unsupported_ones(tmp_path):
    from roofline.io.results import read_rows
    from roofline.measure.sweep import SweepRequest, run_sweep
    from roofline.measure.timer import TimerSettings
    labels = ("bfloat16+weights=int8", "bfloat16+weights=fp8_e4m3_b128")
    req = SweepRequest(model=tiny(), q=(1, 2), B=(1,), L=(8,), dtypes=labels, mtp_q=(1,),
                     timer=TimerSettings(warmup=0, min_reps=2, max_reps=2))
    run_sweep(req, tmp_path, progress=False)
    rows = {(r["dtype"], r["kind"], r["q"]): r for r in read_rows(tmp_path / "points.jsonl")}
    ok = rows[(labels[0], "forward", 2)]
    assert ok["status"] == "ok" and ok["weights_format"] == "int8" and ok["act_dtype"] == "bfloat16"
    assert ok["weight_bytes"] == forward_cost(tiny(), labels[0], 1, 2, 8).weight_bytes
    assert ok["dequant_ops"] > 0
    r = rows[(labels[1], "forward", 1)]
    assert r["status"] == "unsupported" and "weights=fp8_e4m3_b128 on device=cpu" in r["error"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int4_g128", "fp8", "fp8_channel", "fp8_e4m3_b128"])
def test_cuda_kernels_match_the_dequantised_reference(name):
    """tinygemm int4 and _scaled_mm fp8 (activations quantised per call: e4m3 rounding of x as
    well, hence the looser 2^-3 bound for fp8) against the dequantised float64 matmul."""
    fmt = parse_format(name)
    if quant.kernel_for(fmt, "cuda") is None:
        pytest.skip(f"{name}: this GPU is below the kernel's compute capability")
    w = weight(256, 512, seed=6).cuda()
    lin = quant.packed_linear(w, fmt, device="cuda")
    assert not lin.reference and lin.held_bytes() == fmt.matrix_bytes(256, 512, 2)
    x = torch.randn(8, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(7)).to(torch.bfloat16)
    deq = quant.quantize(w.cpu(), fmt).dequantize().double()
    ref = x.cpu().double() @ deq.T
    scale = x.cpu().double().abs() @ deq.abs().T
    tol = 2 ** -3 if fmt.kind == "fp8" else 2 ** -7
    assert ((lin(x).cpu().double() - ref).abs() <= tol * scale + 1e-4).all()


@pytest.mark.parametrize("name", ["llama-3.1-70b", "deepseek-v3"])
def test_rank_memory_in_a_quantized_precision(name):
    """One rank of tp1 holds exactly the single-device bytes; tp2 of a dense model splits the
    blocks and the head and keeps the embedding whole; the KV cache shrinks with its format."""
    from roofline.parallel.cost import memory_per_rank
    from roofline.parallel.layout import Layout
    cfg = get_preset(name)
    label = "bfloat16+weights=int4_g128+kv=fp8_e4m3" if name.startswith("llama") else "bfloat16+weights=fp8_e4m3_b128"
    w1, kv1 = memory_per_rank(cfg, Layout(tp=1), label, 4, 1024, with_mtp=True)
    assert w1 == pytest.approx(resident_weight_bytes(cfg, label, with_mtp=True), rel=1e-12)
    _, kv_bf16 = memory_per_rank(cfg, Layout(tp=1), "bfloat16", 4, 1024, with_mtp=True)
    assert kv1 == kv_bf16 / (2 if "kv=" in label else 1)
    if name.startswith("llama"):
        w2, _ = memory_per_rank(cfg, Layout(tp=2), label, 4, 1024)
        embed = cfg.vocab * cfg.d * 2
        half = (resident_weight_bytes(cfg, label, with_mtp=False) - embed) / 2  # norms stay whole: ~2e-5 more
        assert half < w2 - embed < half * (1 + 1e-4)


def _torch_block_rule(t: torch.Tensor, scale: torch.Tensor, kind: str) -> bool:
    """torch's own layout rule for block-scaled _scaled_mm, as aten/src/ATen/native/cuda/ScaledBlas.cpp
    states it (is_blockwise_1x128_scaling, is_blockwise_128x128_scaling; check_size_stride skips the
    stride of a dimension of size <= 1)."""
    def size_stride(dim, size, stride):
        return scale.size(dim) == size and (size <= 1 or scale.stride(dim) == stride)
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    if scale.dtype != torch.float32 or scale.dim() != 2:
        return False
    if kind == "1x128":
        return size_stride(0, t.size(0), 1) and size_stride(1, cdiv(t.size(1), 128), t.size(0))
    return (size_stride(0, cdiv(t.size(0), 128), cdiv(cdiv(t.size(1), 128), 4) * 4)
            and size_stride(1, cdiv(t.size(1), 128), 1))


@pytest.mark.parametrize("M", [1, 5, 130])
@pytest.mark.parametrize("N, K", [(384, 640), (256, 1024), (200, 128)])
def test_fp8_block_scales_reach_scaled_mm_in_the_layout_torch_requires(monkeypatch, M, N, K):
    """The b128 path hands _scaled_mm scales that pass torch's own check (the activation scales
    outer-dim-major, the weight's with 16-byte aligned rows) at M > 1 too, and the product they
    describe is the dequantised one. _scaled_mm is replaced by a checker: the CUDA kernel is not here."""
    fmt = parse_format("fp8_e4m3_b128")
    w = weight(N, K, seed=2)
    lin = quant.Fp8Linear(quant.quantize(w, fmt), reference=False)
    seen = []

    def scaled_mm(a, b, scale_a, scale_b, out_dtype):
        ok_a = _torch_block_rule(a, scale_a, "1x128")
        ok_b = _torch_block_rule(b.t(), scale_b.t(), "128x128")  # checked on the transposes (get_joint_scaling)
        seen.append((ok_a, ok_b))
        sa = scale_a.repeat_interleave(128, 1)[:, :K]
        sb = scale_b.t().repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
        return ((a.float() * sa) @ (b.t().float() * sb).t()).to(out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).to(torch.bfloat16)
    y = lin._matmul(x)
    assert seen == [(True, True)]
    ref = x.float() @ quant.quantize(w, fmt).dequantize().t()
    assert torch.nn.functional.cosine_similarity(y.float().flatten(), ref.flatten(), dim=0) > 0.999


def test_llama_cpp_block_formats_price_their_bytes_and_are_not_run_here():
    """GGUF's block formats by their names, their bytes as ggml-common.h lays the blocks out: q8_0 34 bytes per 32
    weights (8.5 bits), q4_0 18 (4.5), q4_1 20 (5.0), q4_k 144 per 256 (4.5); int8_g32 is q8_0's bytes; a KV cache in
    q8_0 / q4_0 holds a scale per 32 elements of a head's row. This decoder quantizes none of them: a sweep is refused
    naming the format, the what-if prices them."""
    bits = {n: parse_format(n).matrix_bytes(4096, 4096, 2) * 8 / 4096 ** 2
            for n in ("q8_0", "q4_0", "q4_1", "q4_k", "int8_g32")}
    assert bits == {"q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q4_k": 4.5, "int8_g32": 8.5}
    assert parse_format("q8_0", "kv").kv_token_bytes(8 * 128, 8, 2) == 8 * (128 + 4 * 2)
    assert parse_format("q4_0", "kv").kv_token_bytes(8 * 128, 8, 2) == 8 * (64 + 4 * 2)
    with pytest.raises(ConfigError, match="kv='q4_k'"):
        parse_format("q4_k", "kv")
    with pytest.raises(ConfigError, match="group size 24"):
        parse_format("int8_g24")
    m = build_model(tiny(), max_batch=1, max_context=16, dtype=torch.bfloat16)
    for name in ("q4_0", "q4_1", "q8_0", "int8_g32"):
        assert quant.kernel_for(parse_format(name), "cpu") is None
        with pytest.raises(quant.Unsupported, match=f"weights={name}: priced by the what-if"):
            quant.quantize(weight(64, 64), parse_format(name))
    with pytest.raises(quant.Unsupported, match="weights=q4_0 on device=cpu: no kernel here runs it"):
        quant.quantize_model(m, "bfloat16+weights=q4_0", "cpu")
    q4 = forward_cost(get_preset("llama-2-7b"), "float16+weights=q4_0+lm_head=q8_0", 1, 1, 128)
    f16 = forward_cost(get_preset("llama-2-7b"), "float16", 1, 1, 128)
    assert 0.28 < q4.weight_bytes / f16.weight_bytes < 0.29  # 4.5 / 16 of the blocks, 8.5 / 16 of the LM head


def test_gguf_weights_bring_the_output_tensor_llama_cpp_writes():
    """llama.cpp's quantizer writes a file's output tensor (the LM head) in Q6_K unless the file is Q8_0, the model
    is Falcon or its row length d is not a multiple of Q6_K's 256-weight super-block (then Q8_0): weights=q4_0
    without lm_head= prices that head (210 bytes per 256 weights), not a float16 one; lm_head= still decides, and a
    label is read as it says."""
    llama, falcon = get_preset("llama-3.1-8b"), get_preset("falcon-180b")
    assert parse_format("q6_k").matrix_bytes(4096, 4096, 2) * 8 / 4096 ** 2 == 6.5625
    with pytest.raises(ConfigError, match="kv='q6_k'"):
        parse_format("q6_k", "kv")
    label = lambda w, model=llama, **kw: precision("float16", w, model=model, **kw).label  # noqa: E731
    assert label("q4_0") == "float16+weights=q4_0+lm_head=q6_k"
    assert label("q4_k") == "float16+weights=q4_k+lm_head=q6_k"
    assert label("q8_0") == "float16+weights=q8_0+lm_head=q8_0"
    assert label("q4_0", falcon) == "float16+weights=q4_0+lm_head=q8_0"
    assert label("q4_0", dataclasses.replace(llama, d=4160)) == "float16+weights=q4_0+lm_head=q8_0"  # 4160 % 256
    assert label("q4_0", lm_head="fp16") == "float16+weights=q4_0"  # given: kept
    assert label("int4_g128") == "float16+weights=int4_g128"  # not a GGUF format
    assert precision("float16+weights=q4_0").label == "float16+weights=q4_0"  # a label as it says
    head = lambda p: forward_cost(llama, p, 1, 1, 128).weight_bytes  # noqa: E731
    assert head(label("q4_0")) - head("float16+weights=q4_0") == pytest.approx(
        llama.vocab * llama.d * (6.5625 - 16) / 8, rel=1e-6)


def test_a_gguf_embedding_table_is_held_as_llama_cpp_writes_and_keeps_it():
    """A GGUF file's token_embd is in the file's type (an untied model) or the output tensor's (a tied one: llama.cpp
    quantizes it by the output's rules); llama.cpp keeps the table in host memory (its input layer always on the
    CPU), so its device holds the blocks and the LM head only, while an engine without that rule holds the table
    too. Llama-2-7B in Q4_0: 3.56 GiB of tensors (the table in Q4_0, the head in Q6_K), not the 3.74 GiB a float16
    table gave; a non-GGUF format leaves the table in the activation dtype."""
    cfg = get_preset("llama-2-7b")
    q4 = precision("float16", "q4_0", model=cfg)
    table = cfg.vocab * cfg.d
    assert embedding_format(cfg, q4).name == "q4_0" and embedding_bytes(cfg, q4) == table // 32 * 18
    assert resident_weight_bytes(cfg, q4.label) / 2 ** 30 == pytest.approx(3.5619, abs=1e-4)
    assert embedding_format(cfg, parse_precision("float16+weights=int4_g128")).name == "float16"
    tied = dataclasses.replace(cfg, tie_embeddings=True)
    qt = precision("float16", "q4_0", model=tied)
    assert embedding_format(tied, qt).name == "q6_k"
    assert head_bytes(tied, qt) == embedding_bytes(tied, qt) == table // 256 * 210  # the tied head read in Q6_K
    assert forward_cost(tied, qt, 1, 1, 128).embed_bytes == cfg.d // 256 * 210  # one gathered row, in its format
    dev = get_datasheet("rtx4090")
    held = {e: memory_check(cfg, dev, q4.label, Layout(), 1, 4096, setting=Setting(engine=e))["weights_GB"]
            for e in ("llama.cpp", "vllm")}
    assert (held["vllm"] - held["llama.cpp"]) * 1e9 == pytest.approx(embedding_bytes(cfg, q4), rel=1e-9)
    rule = memory_check(cfg, dev, q4.label, Layout(), 1, 4096, setting=Setting(engine="llama.cpp"))["memory_rule"]
    assert rule.endswith("llama.cpp keeps the embedding table in host memory")  # the card says where it went
    tied_held = {e: memory_check(tied, dev, qt.label, Layout(), 1, 4096, setting=Setting(engine=e))["weights_GB"]
                 for e in ("llama.cpp", "vllm")}
    assert tied_held["llama.cpp"] == tied_held["vllm"]  # a tied table is held once, as the LM head, either way
    kv = memory_check(cfg, dev, q4.label, Layout(), 1, 4096)["kv_GB"] * 1e9  # one sequence's cache
    room = WhatIf(cfg, dev, q4.label, Layout(), Setting(engine="llama.cpp")).max_running("llama.cpp", 4096)
    assert room == int((0.9 * dev.usable_mem_bytes() - held["llama.cpp"] * 1e9) // kv)  # the table's room is KV's


def test_a_gguf_k_m_file_gives_attn_v_and_ffn_down_more_bits_as_llama_cpp_quantizes():
    """Q4_K_M / Q5_K_M are file types, not one tensor format: llama.cpp's quantizer writes attn_v and ffn_down in
    Q6_K in its use_more_bits layers (16 of 32), a 70B model's other attn_v in Q5_K, and an 8-expert model's
    attn_k / attn_v in Q8_0 whatever the type; the rest in Q4_K / Q5_K. The sizes are what llama-bench prints for
    such files (Llama-2-7B Q4_K_M 3.80 GiB, Q5_K_M 4.45 GiB; Llama-3.1-70B Q4_K_M 39.59 GiB), and a decode step
    reads the extra bytes too."""
    assert sum(gguf_more_bits(i, 32) for i in range(32)) == 16 and sum(gguf_more_bits(i, 80) for i in range(80)) == 40
    assert parse_format("q5_k").matrix_bytes(256, 256, 2) == 256 * 176  # block_q5_K: 176 bytes per 256 weights
    gib = lambda name, w: resident_weight_bytes(get_preset(name), precision(  # noqa: E731
        "float16", w, model=get_preset(name)).label) / 2 ** 30
    assert round(gib("llama-2-7b", "q4_k_m"), 2) == 3.80 and round(gib("llama-2-7b", "q5_k_m"), 2) == 4.45
    assert round(gib("llama-3.1-70b", "q4_k_m"), 2) == 39.59
    assert gib("llama-2-7b", "q4_k") < gib("llama-2-7b", "q4_k_m")
    llama70, mixtral = get_preset("llama-3.1-70b"), get_preset("mixtral-8x7b")
    v70 = dict((f.name, x) for f, x in gguf_tensor_formats(GGML["q4_k_m"], "attn_v", llama70))
    assert v70 == {"q6_k": 0.5, "q5_k": 0.5}
    assert gguf_tensor_formats(GGML["q4_0"], "attn_k", mixtral) == ((GGML["q8_0"], 1.0),)
    assert gguf_tensor_formats(GGML["q4_0"], "ffn_down", get_preset("llama-2-7b")) == ((GGML["q4_0"], 1.0),)
    cfg = get_preset("llama-2-7b")  # one decode step reads the Q6_K halves of attn_v and ffn_down
    step = lambda w: forward_cost(cfg, precision("float16", w, model=cfg).label, 1, 1, 128).weight_bytes  # noqa
    v, down = cfg.kv_heads * cfg.head_dim * cfg.d, cfg.d * cfg.ffn
    assert step("q4_k_m") - step("q4_k") == pytest.approx(cfg.layers / 2 * (v + down) * (210 / 256 - 144 / 256),
                                                          rel=1e-9)


def test_llama_server_runs_its_four_default_slots_unless_a_run_says_more():
    """llama-server decodes at most its slots' sequences (-np; 4 by default since its unified KV cache): a plan for
    llama.cpp with no cap of its own stops at B = 4 however much memory is left, and max_running= lifts it."""
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("rtx4090")
    label = precision("float16", "q4_k_m", model=cfg).label
    w = WhatIf(cfg, dev, label, Layout(), Setting(engine="llama.cpp"))
    assert sequence_cap(w, "llama.cpp") == 4 and sequence_cap(w, "llama.cpp", max_running=16) == 16
    assert w.max_running("llama.cpp", 4608) > 4  # the memory alone would hold more
    plan = lambda **kw: capacity(cfg, dev, label, 4096, 512, 50.0, 1e4, setting=Setting(engine="llama.cpp"),  # noqa
                                 layouts=[Layout()], **kw)[0]
    assert (plan()["batch"], plan()["seq_cap"]) == (4, 4)
    assert plan(max_running=16)["batch"] == 16  # a run with -np 16: its ITL still meets the 50 ms target


def test_gguf_files_weigh_what_llama_bench_prints_for_them():
    """The byte model of a GGUF file, its embedding table and mixed types included, against the model sizes llama-bench
    prints (geerlingguy/ai-benchmarks issue #43, an RTX 4090, 2025-12): TinyLlama-1.1B Q4_K_M 636.18 MiB (the 0.18 is
    its float32 norms, held here in float16), Llama-3.2-3B Q4_K_M 1.87 GiB (a tied table: Q6_K, as the head; a
    float16 table gave 2.45 GiB)."""
    base = get_preset("llama-3.1-8b")
    tiny = base.scaled(d=2048, layers=22, heads=32, kv_heads=4, head_dim=64, ffn=5632, vocab=32000)
    l3b = dataclasses.replace(base.scaled(d=3072, layers=28, heads=24, kv_heads=8, head_dim=128, ffn=8192),
                              tie_embeddings=True)
    size = lambda cfg: resident_weight_bytes(cfg, precision("float16", "q4_k_m", model=cfg).label)  # noqa: E731
    assert size(tiny) / 2 ** 20 == pytest.approx(636.18, abs=0.2)
    assert round(size(l3b) / 2 ** 30, 2) == 1.87
