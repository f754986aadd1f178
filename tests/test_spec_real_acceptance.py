"""Real acceptance on a saved checkpoint with its MTP layer and a chat tokenizer."""

import json

import pytest

from roofline.io.fields import ConfigError
from roofline.spec.real_acceptance import AcceptanceRequest, measure_acceptance
from tests.helpers import CONVERSATION, add_mtp_layer, hf_model, save_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsv3")
    hf = hf_model("deepseek_v3", seed=11)
    hf.save_pretrained(folder)
    add_mtp_layer(hf, folder)
    save_tokenizer(folder)
    chats = folder / "chats.jsonl"
    chats.write_text("\n".join(json.dumps({"messages": CONVERSATION[:n]}) for n in (2, 3, 2)) + "\n")
    return folder


@pytest.mark.slow
def test_mtp_acceptance_counters_are_consistent(checkpoint):
    out = measure_acceptance(AcceptanceRequest(checkpoint=str(checkpoint), prompts=str(checkpoint / "chats.jsonl"),
                                               drafter="mtp", k=2, max_new=8, batch=2, dtype="float32"))
    assert out["prompts"] == 3
    assert out["num_draft_tokens"] == 2 * out["num_drafts"] > 0
    per = out["num_accepted_tokens_per_pos"]
    assert sum(per) == out["num_accepted_tokens"] and per[0] >= per[1]


def test_a_draft_model_equal_to_the_target_is_always_accepted(checkpoint):
    out = measure_acceptance(AcceptanceRequest(checkpoint=str(checkpoint), prompts=str(checkpoint / "chats.jsonl"),
                                               drafter="draft_model", draft_checkpoint=str(checkpoint), k=3,
                                               max_new=9, batch=3, dtype="float32"))
    assert out["acceptance_rate"] == 1.0 and out["alpha_per_pos"] == [1.0, 1.0, 1.0]


def test_draft_model_without_a_folder_is_refused():
    with pytest.raises(ConfigError, match="draft_checkpoint"):
        AcceptanceRequest(checkpoint="x", prompts="y", drafter="draft_model")


@pytest.mark.slow
def test_specdec_entry_point_measures_real_acceptance(checkpoint):
    import subprocess
    import sys

    from roofline.model.presets import REPO_ROOT
    r = subprocess.run([sys.executable, "-m", "roofline.cli.specdec", f"checkpoint={checkpoint}",
                        f"prompts={checkpoint / 'chats.jsonl'}", "ks=[2]", "Bs=[2]", "max_new=6", "dtype=float32"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["k"] == 2 and out["prompts"] == 3 and len(out["alpha_per_pos"]) == 2
