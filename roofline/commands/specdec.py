"""plain vs speculative decoding, measured against the cost model

`python -m roofline.cli.specdec model=cpu-demo` (roofline/conf/specdec.yaml; `device` is the torch device):
the composed config as a plain dict in, the console table and the JSON summary out. With
`checkpoint=DIR prompts=chats.jsonl` the checkpoint's real per-position acceptance instead (as
the acceptance command). With `fail_on_mismatch=true` it returns REGRESSION when a predicted and
a measured speedup are a MISMATCH (more than 2x apart)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from roofline.io import files
from roofline.commands import REGRESSION, refuse_unused
from roofline.commands.acceptance import acceptance
from roofline.spec.real_acceptance import AcceptanceRequest
from roofline.io.fields import from_dict, option
from roofline.io.results import RUNS_ROOT
from roofline.measure.timer import TimerSettings
from roofline.model.config import ModelConfig
from roofline.report.document import write_report
from roofline.report.sections import write_specdec_section
from roofline.spec.real_validation import RealValidationRequest, run_real_validation, summarize
from roofline.spec.validation import SpecValidationRequest, run_validation

_CONSOLE_COLUMNS = ["drafter", "k", "B", "tau_meas", "alpha_meas", "S_meas", "S_pred", "err"]


# what the `device` entry (roofline/conf/device/) means to this command: the torch device to run on
DEVICE_AS = "torch"


@dataclass(frozen=True)
class SpecdecKeys:
    """The keys that are not fields of the oracle validation's request: what it runs on, where it
    writes, and the checkpoint modes (real acceptance; real drafters against the prediction)."""

    model: dict | None = option(None, "model preset (roofline/conf/model/)")
    device: dict | None = option(None, "roofline/conf/device/: cpu | cuda | a datasheet GPU row (h200_sxm, ...); "
                                       "device.torch=cuda:N picks a GPU")
    out_dir: str | None = option(None, "default: results/runs/specdec-<model>-<fingerprint of this request>")
    fail_on_mismatch: bool = option(False, "CI: exit 3 (REGRESSION) when a predicted and a measured speedup are a "
                                           "MISMATCH (> 2x apart)")
    checkpoint: str | None = option(None, "a Hugging Face model folder: real acceptance instead of the oracle "
                                          "validation (k = max(ks), batch = max(Bs); as the acceptance command)")
    prompts: str | None = option(None, "with checkpoint: chat prompts (JSONL); with prompts_eval, set A "
                                       "(acceptance per position and the overhead calibration)")
    drafter: str = option(AcceptanceRequest.drafter, "checkpoint without prompts_eval: mtp | draft_model | ngram")
    draft_checkpoint: str = option(AcceptanceRequest.draft_checkpoint, "the draft model's folder (drafter="
                                                                       "draft_model; same vocabulary)")
    prompts_eval: str | None = option(None, "with checkpoint and prompts: set B, other conversations (the "
                                            "engine's measured points): every drafter at every (k, B) of ks x Bs")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (SpecValidationRequest, SpecdecKeys, RealValidationRequest)


def _fingerprint(req) -> str:
    import dataclasses
    import hashlib
    import json
    return hashlib.sha256(json.dumps(dataclasses.asdict(req), sort_keys=True, default=str).encode()).hexdigest()[:10]


# what the oracle validation reads and the real-acceptance mode (checkpoint= alone) does not
_ORACLE_ONLY = {"alphas": "the oracle drafter's acceptance", "prompt_len": "random prompts' length",
                "real_drafters": "the oracle validation's real drafters", "reps": "timed pairs per point",
                "out_dir": "the validation's run folder (acceptance prints its counters)",
                "fail_on_mismatch": "the validation's CI verdict", "timer": "the calibration sweep",
                "model": "a preset (checkpoint= replaces it)"}


def specdec(c: Mapping) -> tuple[str, dict]:
    """Plain vs speculative decoding measured against the cost model, with the run's report; or,
    with `checkpoint`, the checkpoint's real acceptance at k = max(ks) and batch = max(Bs)."""
    if c["checkpoint"] and c.get("prompts_eval"):
        req = RealValidationRequest(checkpoint=c["checkpoint"], draft_checkpoint=c["draft_checkpoint"], prompts_a=c["prompts"],
                           prompts_b=c["prompts_eval"], drafters=tuple(c["drafters"]), ks=tuple(c["ks"]),
                           Bs=tuple(c["Bs"]), max_new=c["max_new"], n_prompts=c["n_prompts"], reps=c["reps"],
                           dtype=c["dtype"], temperature=c["temperature"], device=c["device"], seed=c["seed"],
                           timer=from_dict(TimerSettings, c["timer"], "timer"), parts_rounds=c["parts_rounds"],
                           threads=c["threads"])
        run_dir = Path(c["out_dir"] or RUNS_ROOT / f"specdec-real-{Path(c['checkpoint']).name}-{req.dtype}")
        table = run_real_validation(req, run_dir)
        text, summary = summarize(table)
        return text, dict(run_dir=str(run_dir), overrides=c.get("overrides", []), **summary)
    if c["checkpoint"]:
        refuse_unused(c.get("overrides"), _ORACLE_ONLY, "checkpoint= without prompts_eval= (real acceptance only)")
        return acceptance(dict(checkpoint=c["checkpoint"], prompts=c["prompts"], drafter=c["drafter"],
                               draft_checkpoint=c["draft_checkpoint"], k=max(c["ks"]), max_new=c["max_new"],
                               batch=max(c["Bs"]), dtype=c["dtype"], device=c["device"], seed=c["seed"],
                               temperature=c["temperature"]))
    req = SpecValidationRequest(model=ModelConfig.from_dict(c["model"]), alphas=tuple(c["alphas"]), ks=tuple(c["ks"]),
                       Bs=tuple(c["Bs"]), prompt_len=c["prompt_len"], max_new=c["max_new"], reps=c["reps"],
                       real_drafters=tuple(c["real_drafters"]), dtype=c["dtype"], device=c["device"],
                       seed=c["seed"], timer=from_dict(TimerSettings, c["timer"], "timer"))
    # the default folder is this request's own (a fingerprint of it), never another request's to refuse
    run_dir = Path(c["out_dir"] or RUNS_ROOT / f"specdec-{req.model.name}-{_fingerprint(req)}")
    table = run_validation(req, run_dir)
    write_specdec_section(table, run_dir)
    # the run's report: its sweep, cost-model fit and this validation, one document
    write_specdec_section(table, run_dir / "sweep")
    report, _ = write_report(run_dir / "sweep")
    e = table["err"].abs()  # |S_pred / S_meas - 1|, a fraction of the measured speedup
    summary = dict(run_dir=str(run_dir), report=str(report), points=len(table),
                   median_abs_err=float(e.median()), max_abs_err=float(e.max()),
                   mismatches=int(table["mismatch"].astype(bool).sum()) if "mismatch" in table else 0)
    return table[_CONSOLE_COLUMNS].round(3).to_string(index=False), summary


def run(c: dict) -> int:
    text, summary = specdec(c)
    print(text)
    print(files.json_text(summary))
    return REGRESSION if c["fail_on_mismatch"] and summary.get("mismatches") else 0
