"""Check layer-sliced extrapolation against a full-depth run of the same grid:
`python -m experiments.slicing full_dir=results/runs/A sliced_dir=results/runs/B`."""

import json

import hydra

from experiments.entry import fail_fast, plain
from roofline.io.results import load_run
from roofline.measure.sweep import slicing_error


@hydra.main(config_path="../conf", config_name="slicing", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        t = slicing_error(load_run(c["full_dir"]), load_run(c["sliced_dir"]))
        print(t.round(4).to_string(index=False))
        e = t["rel_err"].abs()
        ok = t["status"] == "ok"
        print(json.dumps(dict(points=len(t), median_abs_err=float(e.median()), max_abs_err=float(e.max()),
                              mean_signed_err=float(t["rel_err"].mean()), refused=int((~ok).sum()),
                              median_abs_err_not_refused=float(e[ok].median()) if ok.any() else None)))


if __name__ == "__main__":
    main()
