"""The inventory catches every way a conversion can lose a tensor, and nothing else."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from roofline.io.fields import ConfigError
from roofline.checkpoints.inventory import compare, load_rename_map, read_checkpoint, rename

REPO = Path(__file__).resolve().parents[1]
CONFIG = dict(model_type="deepseek_v3", num_hidden_layers=2, num_nextn_predict_layers=1, hidden_size=32,
              vocab_size=64)
MTP = ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "input_layernorm",
       "self_attn.q_proj", "mlp.down_proj")


def deepseek_like(seed: int) -> dict[str, torch.Tensor]:
    """A DeepSeek-V3-like tensor set: 2 decoder layers, the MTP module as layer 2; bf16 and fp32."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype)

    t = {"model.embed_tokens.weight": w(64, 32), "model.norm.weight": w(32, dtype=torch.float32),
         "lm_head.weight": w(64, 32)}
    for i in range(2):
        t |= {f"model.layers.{i}.input_layernorm.weight": w(32, dtype=torch.float32),
              f"model.layers.{i}.self_attn.q_proj.weight": w(32, 32),
              f"model.layers.{i}.mlp.gate_proj.weight": w(48, 32),
              f"model.layers.{i}.mlp.down_proj.weight": w(32, 48)}
    shapes = {"enorm": (32,), "hnorm": (32,), "eh_proj": (32, 64), "shared_head.norm": (32,),
              "shared_head.head": (64, 32), "input_layernorm": (32,), "self_attn.q_proj": (32, 32),
              "mlp.down_proj": (32, 48)}
    t |= {f"model.layers.2.{k}.weight": w(*shapes[k], dtype=torch.float32 if len(shapes[k]) == 1 else torch.bfloat16)
          for k in MTP}
    return t


def write(folder: Path, tensors: dict, config: dict = CONFIG, shards: int = 1) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / fname))
        weight_map |= {n: fname for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def inventory(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roofline.cli.inventory", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def source(tmp_path):
    tensors = deepseek_like(seed=13)
    return tensors, write(tmp_path / "before", tensors)


def test_identical_copy_is_clean_and_exits_zero(source, tmp_path):
    tensors, before = source
    after = write(tmp_path / "after", {k: v.clone() for k, v in tensors.items()})
    r = inventory(f"before={before}", f"after={after}", f"out={tmp_path / 'out'}")
    assert r.returncode == 0, r.stdout + r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["ok"] is True and last["identical"] == len(tensors) and last["mtp_tensors"] == len(MTP)
    assert all(last[k] == 0 for k in ("missing", "extra", "reshaped", "retyped", "changed", "mtp_lost"))
    saved = json.loads((tmp_path / "out" / "inventory.json").read_text())
    assert len(saved["before"]["tensors"]) == len(tensors) and saved["counts"]["ok"] is True


def test_dropped_mtp_layer_fails_naming_tensors_config_field_and_cost(source, tmp_path):
    tensors, before = source
    kept = {k: v for k, v in tensors.items() if not k.startswith("model.layers.2.")}
    after = write(tmp_path / "after", kept, dict(CONFIG, num_nextn_predict_layers=0))
    r = inventory(f"before={before}", f"after={after}")
    assert r.returncode == 1, r.stdout + r.stderr
    report = r.stdout
    for k in MTP:
        assert f"model.layers.2.{k}.weight" in report
    assert "num_nextn_predict_layers: 1 -> 0" in report
    assert "the MTP drafter is gone" in report and "falls back to plain decoding" in report and "1.8x" in report
    last = json.loads(report.strip().splitlines()[-1])
    assert last["ok"] is False and last["missing"] == len(MTP) == last["mtp_lost"] and last["mtp_config_dropped"]


def test_one_ulp_change_is_reported_as_changed(source, tmp_path):
    tensors, before = source
    name = "model.layers.1.mlp.down_proj.weight"
    w = tensors[name].clone()
    flat = w.view(-1)
    flat[7] = torch.nextafter(flat[7:8], torch.tensor([float("inf")], dtype=w.dtype))[0]
    assert not torch.equal(w, tensors[name])
    c = compare(read_checkpoint(before), read_checkpoint(write(tmp_path / "after", {**tensors, name: w})))
    assert c.changed == (name,) and not c.ok
    assert (c.missing, c.extra, c.reshaped, c.retyped) == ((), (), (), ())


def test_sharded_and_unsharded_copies_are_the_same_checkpoint(source, tmp_path):
    tensors, before = source
    after = write(tmp_path / "after", tensors, shards=2)
    b, a = read_checkpoint(before), read_checkpoint(after)
    assert len(a.shards) == 2 and len(b.shards) == 1
    c = compare(b, a)
    assert c.ok and len(c.identical) == len(tensors)


def test_reshaped_and_retyped_tensors_are_losses(source, tmp_path):
    tensors, before = source
    t = dict(tensors)
    t["model.layers.0.mlp.gate_proj.weight"] = t["model.layers.0.mlp.gate_proj.weight"].reshape(32, 48)
    t["model.norm.weight"] = t["model.norm.weight"].to(torch.bfloat16)
    c = compare(read_checkpoint(before), read_checkpoint(write(tmp_path / "after", t)))
    assert c.reshaped == ("model.layers.0.mlp.gate_proj.weight",)
    assert c.retyped == ("model.norm.weight",)
    assert c.changed == () and not c.ok


def test_extra_tensors_fail_only_when_strict(source, tmp_path):
    tensors, before = source
    after = write(tmp_path / "after", {**tensors, "model.rotary.inv_freq": torch.ones(8)})
    b, a = read_checkpoint(before), read_checkpoint(after)
    assert compare(b, a).ok and compare(b, a).extra == ("model.rotary.inv_freq",)
    assert not compare(b, a, strict=True).ok


def test_rename_map_with_regex_groups_makes_a_converted_checkpoint_clean(source, tmp_path):
    tensors, after = source
    megatron = {k.replace("model.layers.", "decoder.layers.").replace(".mlp.down_proj.", ".mlp.fc2."): v
                for k, v in tensors.items()}
    megatron["embedding.word_embeddings.weight"] = megatron.pop("model.embed_tokens.weight")
    before = write(tmp_path / "megatron", megatron)
    rename_map = tmp_path / "map.yaml"
    rename_map.write_text('"embedding.word_embeddings.weight": model.embed_tokens.weight\n'
                          '"^decoder\\\\.layers\\\\.(\\\\d+)\\\\.mlp\\\\.fc2\\\\.weight$":\n'
                          '  "model.layers.\\\\1.mlp.down_proj.weight"\n'
                          '"^decoder\\\\.layers\\\\.(.+)$": "model.layers.\\\\1"\n'
                          '"^never\\\\.matches$": x\n')
    b, a = read_checkpoint(before), read_checkpoint(after)
    assert not compare(b, a).ok
    c = compare(b, a, load_rename_map(rename_map))
    assert c.ok and len(c.identical) == len(tensors) and c.unused_patterns == ("^never\\.matches$",)
    assert len(c.mtp_before) == len(MTP)  # MTP is recognised under the renamed (HF) names


def test_rename_map_that_merges_two_tensors_is_refused():
    with pytest.raises(ConfigError, match="both become"):
        rename(["a.0", "a.1"], {r"a\.\d": "b"})


def test_index_naming_a_tensor_no_shard_holds_fails_naming_it(source, tmp_path):
    tensors, _ = source
    after = write(tmp_path / "after", tensors, shards=2)
    index = after / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.2.eh_proj.weight.ghost"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="eh_proj.weight.ghost"):
        read_checkpoint(after, "after")


def test_mtp_config_dropped_with_weights_kept_is_a_loss(source, tmp_path):
    tensors, before = source
    after = write(tmp_path / "after", tensors, dict(CONFIG, num_nextn_predict_layers=0))
    c = compare(read_checkpoint(before), read_checkpoint(after))
    assert len(c.identical) == len(tensors) and c.mtp_config_dropped and not c.ok
    assert "will not build the drafter" in c.consequence
