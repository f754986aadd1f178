"""A tiny model trained here in seconds: tokenizer and chat template, HF folder, converter, acceptance."""

import json
import math
import subprocess
import sys

import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from roofline.checkpoints import convert, prompts  # noqa: E402
from roofline.checkpoints.inventory import InventoryRequest, run_inventory  # noqa: E402
from roofline.checkpoints.loader import load_checkpoint  # noqa: E402
from roofline.io.fields import ConfigError  # noqa: E402
from roofline.model.presets import REPO_ROOT  # noqa: E402
from roofline.train import corpus  # noqa: E402
from roofline.train.trainer import ModelShape, TrainRequest, run_training  # noqa: E402

TINY = dict(target=ModelShape(d=32, layers=1, heads=2, kv_heads=2, ffn=64, mtp_layers=1),
            draft=ModelShape(d=16, layers=1, heads=1, kv_heads=1, ffn=32, mtp_layers=0),
            vocab=400, seq_len=32, batch=8, target_steps=40, draft_steps=10, corpus_bytes=120_000,
            eval_windows=8, prompts_per_set=3, progress=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    summary = run_training(TrainRequest(out_dir=str(out), **TINY), log=lambda *a: None)
    return out, summary


COMMITTED = REPO_ROOT / "results" / "trained-stdlib"


@pytest.fixture(params=["tiny", "committed"])
def run_dir(request):
    """A trained run's folder: the tiny one trained here in seconds, or the committed one."""
    if request.param == "committed":
        if not (COMMITTED / "target").is_dir():
            pytest.skip("no committed trained model")
        return COMMITTED
    return request.getfixturevalue("trained")[0]


def _vocab(folder) -> int:
    return json.loads((folder / "config.json").read_text())["vocab_size"]


def test_split_is_by_path_and_deterministic():
    c1, c2 = corpus.list_corpus(), corpus.list_corpus()
    assert c1.files == c2.files
    train, a, b = (set(c1.files[s]) for s in ("train", "a", "b"))
    assert train and a and b and not (train & a) and not (train & b) and not (a & b)
    assert all(corpus.split_of(r, 10) == "a" for r in a)
    assert not any("site-packages" in r for r in train | a | b)


def test_training_lowers_the_loss(trained):
    out, summary = trained
    t = summary["models"]["target"]
    log = json.loads((out / "target" / "train_log.json").read_text())["history"]
    first = sum(h[1] for h in log[:5]) / 5
    last = sum(h[1] for h in log[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert t["heldout_loss"] < float(torch.log(torch.tensor(400.0)))  # better than uniform over the vocabulary
    assert summary["models"]["target"]["params"]["mtp"] > 0 and summary["models"]["draft"]["params"]["mtp"] == 0


def test_chat_template_prefix_property(run_dir):
    out = run_dir
    tok = prompts.load_tokenizer(out / "target")
    conv = json.loads((out / "prompts_a.jsonl").read_text().splitlines()[0])["messages"]
    full = prompts.render(tok, conv, add_generation_prompt=False)
    prompt = prompts.render(tok, conv[:-1], add_generation_prompt=True)
    assert full.startswith(prompt) and len(full) > len(prompt)
    ids_full, ids_prompt = prompts.encode(tok, full), prompts.encode(tok, prompt)
    assert ids_full[:len(ids_prompt)] == ids_prompt
    assert ids_prompt[0] == tok.bos_token_id and ids_prompt[1] != tok.bos_token_id  # one BOS
    assert tok(prompt)["input_ids"][:2] == [tok.bos_token_id] * 2  # the trap encode() avoids
    inline = json.loads((out / "target" / "tokenizer_config.json").read_text())["chat_template"]
    assert (out / "target" / "chat_template.jinja").read_text() == inline


def test_transformers_logits_equal_ours(run_dir):
    from transformers import AutoModelForCausalLM
    folder = run_dir / "target"
    ours = load_checkpoint(folder, dtype="float32", max_batch=2, max_context=64)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    x = torch.randint(0, _vocab(folder), (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(x).logits
    got = ours(x, 0)
    assert ours.cfg.mtp_layers == 1
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def _forward(folder, x):
    return load_checkpoint(folder, dtype="float32", max_batch=2, max_context=64)(x, 0)


def test_megatron_round_trip_faithful_and_lossy(run_dir, tmp_path):
    src = run_dir / "target"
    x = torch.randint(0, _vocab(src), (2, 12), generator=torch.Generator().manual_seed(1))
    ref = _forward(src, x)
    back = convert.round_trip(src, tmp_path / "faithful", tp=2)
    assert len(list((tmp_path / "faithful" / "megatron").glob("mp_rank_*/model.safetensors"))) == 2
    c = run_inventory(InventoryRequest(before=str(src), after=str(back)))
    assert c.ok and not c.missing and not c.changed and len(c.identical) == len(c.before.tensors)
    assert torch.equal(_forward(back, x), ref)
    lossy = convert.round_trip(src, tmp_path / "lossy", tp=2, drop_mtp=True)
    assert torch.equal(_forward(lossy, x), ref)  # forward parity cannot see the loss
    c = run_inventory(InventoryRequest(before=str(src), after=str(lossy)))
    assert not c.ok and c.mtp_config_dropped
    assert set(c.mtp_lost) == set(c.mtp_before) and any(".eh_proj." in n for n in c.mtp_lost)
    assert "MTP drafter is gone" in c.consequence
    r = subprocess.run([sys.executable, "-m", "roofline.cli.inventory", f"before={src}", f"after={lossy}"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "eh_proj" in r.stdout and "DROPPED" in r.stdout


def test_acceptance_counters_on_the_trained_model(trained):
    from roofline.spec.real_acceptance import AcceptanceRequest, measure_acceptance
    out, _ = trained
    rows = {}
    for drafter in ("mtp", "draft_model", "ngram"):
        rows[drafter] = measure_acceptance(AcceptanceRequest(
            checkpoint=str(out / "target"), prompts=str(out / "prompts_a.jsonl"), drafter=drafter,
            draft_checkpoint=str(out / "draft"), k=2, max_new=8, batch=3, dtype="float32"))
    for r in rows.values():
        assert r["num_drafts"] > 0 and r["num_draft_tokens"] == 2 * r["num_drafts"]
        assert sum(r["num_accepted_tokens_per_pos"]) == r["num_accepted_tokens"]
        assert r["num_accepted_tokens_per_pos"][1] <= r["num_accepted_tokens_per_pos"][0]


def test_broken_chat_template_is_one_line(trained, tmp_path):
    out, _ = trained
    import shutil
    folder = tmp_path / "broken"
    shutil.copytree(out / "target", folder)
    (folder / "chat_template.jinja").write_text("{{ bos_token }}\n{% for m in messages %}\n{{ messages.append(m) }}{% endfor %}")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (folder / "chat_template.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = prompts.load_tokenizer(folder)
    with pytest.raises(ConfigError, match=r"checkpoint=.*: chat_template line 3: SecurityError"):
        prompts.render(tok, [{"role": "user", "content": "x"}])
    (folder / "chat_template.jinja").write_text("{{ bos_token }}\n{% for m in messages %}\n{{ m['content'] }")
    cfg["chat_template"] = (folder / "chat_template.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = prompts.load_tokenizer(folder)
    with pytest.raises(ConfigError, match=r"chat_template line 3: TemplateSyntaxError"):
        prompts.render(tok, [{"role": "user", "content": "x"}])


def test_real_validation_runs_disjoint_and_exact(trained, tmp_path):
    import pandas as pd
    from roofline.measure.timer import TimerSettings
    from roofline.spec.real_validation import RealValidationRequest, run_real_validation, summarize
    out, _ = trained
    req = RealValidationRequest(checkpoint=str(out / "target"), draft_checkpoint=str(out / "draft"),
                       prompts_a=str(out / "prompts_a.jsonl"), prompts_b=str(out / "prompts_b.jsonl"),
                       drafters=("mtp", "ngram"), ks=(1, 2), Bs=(1,), max_new=6, n_prompts=1, reps=2, dtype="float32",
                       timer=TimerSettings(warmup=1, min_reps=2, max_reps=3, rel_ci=0.5, budget_s=0.05),
                       parts_rounds=2)
    table = run_real_validation(req, tmp_path / "rv", log=lambda *a: None)
    assert set(table["drafter"]) == {"mtp", "ngram"} and (table["S_meas"] > 0).all()
    assert (table["S_meas_lo"] <= table["S_meas"]).all() and (table["S_meas"] <= table["S_meas_hi"]).all()
    steps = pd.read_csv(tmp_path / "rv" / "round_parts.csv")
    Ls = sorted(set(steps["L"]))
    assert len(Ls) == 2 and Ls[0] < int(table["L_mid"].iloc[0]) < Ls[1]  # brackets the engine's context, never at it
    assert set(steps["kind"]) == {"forward", "mtp"} and set(steps[steps["kind"] == "forward"]["q"]) == {1, 2, 3}
    assert (steps["n"] == 2 * 2).all()  # parts_rounds x min_reps samples per part
    assert (table["c_draft"][table["drafter"] == "ngram"] == 0).all()
    # acceptance from set A at each k: k=1 predicts from its own alpha_1, k=2 equals the max(ks) profile
    for _, r in table.iterrows():
        alphas = [float(a) for a in r["alpha_a"].split()]
        assert len(alphas) == r["k"]
        assert r["tau_pred"] == pytest.approx(sum(math.prod(alphas[:i]) for i in range(r["k"] + 1)), abs=3e-3)
    # host work priced in the table's time units: the plain step's is plain_rel x the table's T(1)
    assert (table["O_plain_rel"] > 0).all() and (table["O_spec_rel"] > 0).all()
    t1_table = table["T1_pred_s"] - table["O_plain_s"]
    assert (table["O_plain_s"] - table["O_plain_rel"] * t1_table).abs().max() < 1e-12
    k2 = table[table["k"] == 2]
    assert (k2["err_kmax"] == k2["err"]).all()
    text, summary = summarize(table)
    assert summary["points"] == 4 and "Leviathan" in text and "profile at max(ks)" in text


@pytest.mark.slow
def test_train_command(tmp_path):
    from tests.test_cli import last_json, run_cli
    out, r = run_cli("train", f"out_dir={tmp_path}", "target_steps=3", "draft_steps=0", "vocab=300",
                     "corpus_bytes=20000", "seq_len=16", "batch=2", "eval_windows=2", "prompts_per_set=1",
                     "progress=false", "target.d=16", "target.layers=1", "target.heads=2", "target.kv_heads=1",
                     "target.ffn=32")
    assert r.returncode == 0, r.stderr
    summary = last_json(out)
    assert set(summary["models"]) == {"target"} and (tmp_path / "target" / "config.json").is_file()


def test_repetition_measures():
    from roofline.train import quality
    run = [9] * 40 + [1, 2, 3, 4, 5, 6, 7, 8]
    code = list(range(48))
    line = [1, 2, 3, 4, 5, 6] * 8
    assert quality.longest_run(run) == 40 and quality.longest_run(code) == 1 and quality.longest_run([]) == 0
    assert quality.loops(line) and quality.loops([9] * 48) and not quality.loops(code)
    r = quality.repetition([run, code])
    assert r["single_token_run"] == 0.5 and r["loop"] == 0.0 and r["continuations"] == 2
    assert r["distinct"] == pytest.approx((9 / 48 + 1) / 2)
    ref = quality.repetition([code])
    assert quality.degenerate(quality.repetition([run])) and not quality.degenerate(quality.repetition([line]))
    assert quality.repetitive(quality.repetition([line]), ref) and not quality.repetitive(ref, ref)
    assert not quality.degenerate(ref)


def test_the_summary_checks_greedy_text(trained):
    _, summary = trained
    ref = summary["greedy_check_reference"]
    assert ref["continuations"] == 3 and ref["single_token_run"] == 0 and ref["distinct"] > 0.3
    for name in ("target", "draft"):
        c = summary["models"][name]["greedy_check"]
        assert c["continuations"] == 3 and c["tokens"] == 3 * TrainRequest.check_new
        assert isinstance(c["degenerate"], bool) and isinstance(c["repetitive"], bool) and len(c["examples"]) == 2



@pytest.mark.skipif(not (COMMITTED / "target").is_dir(), reason="no committed trained model")
@pytest.mark.parametrize("name", ["target", "draft"])
def test_the_committed_model_is_not_degenerate(name):
    """Greedy text of the committed models on held-out prompts (set b) is not a run of one token
    (the previous model's newline runs: 7 of these 8 prompts). It still loops often (the
    summary's `repetitive`, results/trained-stdlib/README.md), which this does not assert."""
    from tokenizers import Tokenizer

    from roofline.train import quality
    from roofline.train.trainer import check_prompts, greedy_check
    tok = Tokenizer.from_file(str(COMMITTED / "tokenizer" / "tokenizer.json"))
    pairs = check_prompts(tok, COMMITTED / "prompts_b.jsonl", 48)[:8]
    ref = quality.repetition([r for _, r in pairs])
    c = greedy_check(COMMITTED / name, tok, pairs, 48, ref)
    assert not c["degenerate"] and c["single_token_run"] <= 0.25, c
    assert c["distinct"] >= 0.2 * ref["distinct"], c  # the previous model: 0.03 of 0.65


@pytest.mark.parametrize("run,label", [("float32", "float32, greedy"), ("bfloat16", "bfloat16, greedy"),
                                       ("float32-sampled", "float32, sampled (temperature 1)")])
def test_the_committed_speedup_runs_are_what_the_readme_says(run, label):
    """The README's summary row of each committed real-drafter run is its CSV's median and max
    |err| (a row edited by hand, or a CSV replaced without the README, fails here)."""
    import pandas as pd
    folder = COMMITTED / f"specdec-{run}"
    if not (folder / "real_specdec.csv").is_file():
        pytest.skip("no committed speedup run")
    t = pd.read_csv(folder / "real_specdec.csv")
    assert len(t) == 24 and set(t["drafter"]) == {"mtp", "draft_model", "ngram"}
    readme = (COMMITTED / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| {label} | **"))
    cells = [c.strip().strip("*") for c in row.split("|")[1:-1]]
    assert cells[1] == f"{t['err'].abs().median():.1%}" and cells[2] == f"{t['err'].abs().max():.1%}"
