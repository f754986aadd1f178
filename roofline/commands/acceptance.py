"""real per-position acceptance on chat prompts

`python -m roofline.cli.acceptance checkpoint=DIR prompts=chats.jsonl drafter=mtp k=3`: one line per
draft position, then the totals, then the JSON document (strict: a position never reached is null)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from roofline.commands import FormatKeys
from roofline.io.fields import from_dict, option
from roofline.io.files import json_text
from roofline.spec.real_acceptance import AcceptanceRequest, measure_acceptance


# what the `device` entry (roofline/conf/device/) means to this command: the torch device to run on
DEVICE_AS = "torch"


@dataclass(frozen=True)
class AcceptanceKeys:
    """The key that is not a field of the request: what to run it on."""

    device: dict | None = option(None, "roofline/conf/device/: cpu | cuda | a datasheet GPU row (h200_sxm, ...); "
                                       "device.torch=cuda:N picks a GPU")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (AcceptanceRequest, FormatKeys, AcceptanceKeys)


def acceptance(c: Mapping) -> tuple[str, dict]:
    """Real per-position acceptance: one line per draft position, then the totals."""
    out = measure_acceptance(from_dict(AcceptanceRequest, {k: v for k, v in c.items() if k != "overrides"},
                                       "acceptance"))
    lines = [f"position {i + 1}: accepted {n}, conditional alpha {a:.3f}"
             for i, (a, n) in enumerate(zip(out["alpha_per_pos"], out["num_accepted_tokens_per_pos"]))]
    lines.append(f"acceptance rate {out['acceptance_rate']:.3f}, "
                 f"mean acceptance length {out['mean_acceptance_length']:.3f}")
    return "\n".join(lines), out


def run(c: dict) -> None:
    text, out = acceptance(c)
    print(text)
    print(json_text(out))  # strict JSON: a position never reached is null, not NaN
