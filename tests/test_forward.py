"""What a timed forward ran: depth-scaled gate, attention backend per call, kernels per forward."""

import pytest
import torch

from roofline.measure import forward
from roofline.model.decoder import _causal_mask, build_model
from roofline.model.presets import get_preset, scaled_down


def test_min_cosine_grows_linearly_with_depth_in_bf16_and_keeps_the_floor_in_float32():
    eps2 = torch.finfo(torch.bfloat16).eps ** 2
    assert forward.min_cosine(32, torch.bfloat16) == pytest.approx(1 - 64 * eps2)  # 0.99609
    assert 1 - forward.min_cosine(64, "bfloat16") == pytest.approx(2 * (1 - forward.min_cosine(32, "bfloat16")))
    assert forward.min_cosine(2, torch.bfloat16) == 1 - forward.FLOOR  # shallow: the old gate
    assert forward.min_cosine(61, torch.float32) == forward.min_cosine(32, torch.float16) == 1 - forward.FLOOR


def _gate_cosines(dtype, shift):
    cfg = scaled_down(get_preset("llama-3.1-8b")).scaled(layers=32)
    m = build_model(cfg, max_batch=1, max_context=16, dtype=dtype, seed=0)
    toks = torch.randint(0, cfg.vocab, (1, 4), generator=torch.Generator().manual_seed(0))
    full = m(toks, 0).float()
    steps = torch.cat([m(toks[:, i:i + 1], i + shift) for i in range(4)], 1).float()
    return torch.nn.functional.cosine_similarity(full.flatten(), steps.flatten(), dim=0).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_depth_gate_passes_the_real_path_and_catches_a_position_off_by_one(dtype):
    assert forward.depth_cosine_gate(_gate_cosines(dtype, 0), 32, dtype) is None
    why = forward.depth_cosine_gate(_gate_cosines(dtype, 1), 32, dtype)  # RoPE one position late
    assert why is not None and "min_cosine" in why
    assert "cosine nan" in forward.depth_cosine_gate(float("nan"), 32, dtype)


def test_backend_of_each_attention_call_on_the_cpu():
    q2, k = torch.randn(2, 4, 2, 16, dtype=torch.bfloat16), torch.randn(2, 2, 8, 16, dtype=torch.bfloat16)
    assert forward.sdpa_backend(q2[:, :, :1], k, k, None) == "cpu_grouped_matmul"
    assert forward.sdpa_backend(q2, k, k, _causal_mask(torch.tensor([6, 6]), 2, 8)) == "flash"  # CPU flash takes masks
    # MLA's latent attention (576-wide keys, 512-wide values) has no fused kernel
    ql, kl = torch.randn(1, 4, 2, 576, dtype=torch.bfloat16), torch.randn(1, 1, 8, 576, dtype=torch.bfloat16)
    assert forward.sdpa_backend(ql, kl, kl[..., :512], None) == "math"


@pytest.mark.parametrize("name, q, want", [("tiny", 1, "cpu_grouped_matmul"), ("tiny", 3, "flash"),
                                           ("deepseek-v3", 3, "math")])
def test_recorder_sees_every_layer_and_restores_attend(name, q, want):
    from roofline.model import decoder
    cfg = scaled_down(get_preset(name))
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16)
    before = decoder.attend
    with forward.attention_backends() as seen:
        m(torch.zeros(1, q, dtype=torch.long), 4)
    assert seen == [want] * cfg.layers and decoder.attend is before
    assert forward.one_backend(["flash", "math", "flash"]) == "flash+math" and forward.one_backend([]) is None


@pytest.mark.parametrize("name", ["tiny", "deepseek-v3"])  # GQA, and MLA's absorbed latent attention
def test_both_cpu_decode_paths_give_the_same_logits_and_the_recorder_names_each(name):
    from roofline.model import decoder
    cfg = scaled_down(get_preset(name))
    m = build_model(cfg, max_batch=2, max_context=16, dtype=torch.float32)
    toks = torch.randint(0, cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    out = {}
    for impl in decoder.CPU_DECODE_ATTENTION:
        assert decoder.set_cpu_decode_attention(m, impl) == cfg.layers + cfg.mtp_layers
        m.reset_cache()
        m(toks[:, :4], 0)
        with forward.attention_backends() as seen:
            out[impl] = m(toks[:, 4:], 4)  # the decode step over 4 cached keys
        assert ("cpu_grouped_matmul" in seen) == (impl == "grouped") and len(seen) == cfg.layers
    torch.testing.assert_close(out["grouped"], out["sdpa"], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="allowed"):
        decoder.set_cpu_decode_attention(m, "flash")


class _Clock:
    """A clock that charges each decode path a fixed time: the choice follows the times given."""

    def __init__(self, us: dict):
        self.us = us

    def measure(self, fn):
        fn()
        return self.us[fn.__defaults__[0]] * 1e-6  # the path the call runs (its default argument)


@pytest.mark.parametrize("us, want", [({"grouped": 180.0, "sdpa": 60.0}, "sdpa"),
                                      ({"grouped": 60.0, "sdpa": 230.0}, "grouped")])
def test_the_faster_cpu_decode_path_is_chosen_both_ways(us, want):
    m = build_model(scaled_down(get_preset("tiny")), max_batch=2, max_context=16, dtype=torch.bfloat16)
    impl, times = forward.choose_cpu_decode_attention(m, [(1, 9), (2, 16)], torch.bfloat16, reps=3, clock=_Clock(us))
    assert impl == want
    assert times == {"grouped_us": {"B1_L9": us["grouped"], "B2_L16": us["grouped"]},
                     "sdpa_us": {"B1_L9": us["sdpa"], "B2_L16": us["sdpa"]}}


def test_cpu_kernel_count_is_the_top_level_ops():
    a, b = torch.randn(100), torch.randn(100)
    got = forward.count_kernels(lambda: ((a + b) * b).softmax(0), "cpu")  # add, mul, softmax
    assert got == {"kernels_per_forward": 3, "kernels_counted": "cpu_top_level_ops", "kernel_attn_backend": None}
    m = build_model(get_preset("tiny"), max_batch=1, max_context=16)
    per_layer = forward.count_kernels(lambda: m(torch.zeros(1, 1, dtype=torch.long), 3), "cpu")["kernels_per_forward"]
    deeper = build_model(get_preset("tiny").scaled(layers=4), max_batch=1, max_context=16)
    more = forward.count_kernels(lambda: deeper(torch.zeros(1, 1, dtype=torch.long), 3), "cpu")["kernels_per_forward"]
    assert more - per_layer == (more - per_layer) // 2 * 2 > 0  # a fixed number of ops per layer


def test_cuda_kernel_names_name_the_attention_backend():
    names = ["void pytorch_flash::flash_fwd_splitkv_kernel<...>", "ampere_bf16_s16816gemm"]
    assert forward.backend_from_kernel_names(names) == "flash"
    assert forward.backend_from_kernel_names(["fmha_cutlassF_bf16_aligned_64x64_rf_sm80"]) == "efficient"
    assert forward.backend_from_kernel_names(["cudnn_generated_fort_native_sdpa_sm90_knob_7"]) == "cudnn"
    assert forward.backend_from_kernel_names(["triton_poi_fused_add_0"]) is None


def test_math_attention_is_not_a_memory_measurement_on_cuda_only():
    assert forward.is_math_fallback({"attn_backend": "math"}, "cuda")
    assert forward.is_math_fallback({"attn_backend": "flash+math"}, "cuda:0")
    assert not forward.is_math_fallback({"attn_backend": "flash"}, "cuda")
    assert not forward.is_math_fallback({"attn_backend": "math"}, "cpu")


def test_min_cosine_of_a_precision_label_uses_its_compute_dtype():
    assert forward.min_cosine(32, "bfloat16+weights=int8") == forward.min_cosine(32, torch.bfloat16)
    assert forward.min_cosine(32, "bfloat16+weights=fp8_e4m3_b128") == 1 - forward.CEILING  # fp8 math: capped
