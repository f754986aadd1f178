"""Real per-position acceptance of a checkpoint's MTP head or a draft model on chat prompts:
`python -m experiments.acceptance checkpoint=DIR prompts=chats.jsonl drafter=mtp k=3`."""

import json

import hydra

from experiments.entry import fail_fast, plain
from roofline.io.fields import ConfigError, from_dict
from roofline.spec.real_acceptance import AcceptanceRequest, measure_acceptance


@hydra.main(config_path="../conf", config_name="acceptance", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        c.pop("overrides")
        for field in ("checkpoint", "prompts"):
            if not c.get(field):
                raise ConfigError(f"{field} is required")
        out = measure_acceptance(from_dict(AcceptanceRequest, c, "acceptance"))
        for i, (a, n) in enumerate(zip(out["alpha_per_pos"], out["num_accepted_tokens_per_pos"])):
            print(f"position {i + 1}: accepted {n}, conditional alpha {a:.3f}")
        print(f"acceptance rate {out['acceptance_rate']:.3f}, mean acceptance length {out['mean_acceptance_length']:.3f}")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
