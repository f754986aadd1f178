"""Fit the cost model on some sweeps, predict unseen layouts:
`python -m experiments.layout_validation 'train=[A,B]' 'test=[C,D]' collectives=.../collectives.json`."""

import json
from pathlib import Path

import hydra

from experiments.entry import fail_fast, plain
from roofline.io.files import write_csv_atomic, write_json_atomic
from roofline.io.fields import ConfigError
from roofline.parallel.validate import held_out


@hydra.main(config_path="../conf", config_name="layout_validation", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        for key in ("train", "test", "collectives"):
            if not c[key]:
                raise ConfigError(f"{key} is required")
        table, summary = held_out(c["train"], c["test"], c["collectives"])
        if c["out_dir"]:
            out = Path(c["out_dir"])
            out.mkdir(parents=True, exist_ok=True)
            write_csv_atomic(table, out / "layout_validation.csv")
            write_json_atomic(out / "layout_validation.json", summary, default=float)
        print(table.round(5).to_string(index=False))
        print(json.dumps(summary, default=float))


if __name__ == "__main__":
    main()
