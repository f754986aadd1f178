"""The report of a run folder: pictures and key tables, as Markdown and as one self-contained
HTML file (images embedded as base64 PNG data URIs, no external links).

It reads the run folder alone, so it runs anywhere (no GPU, no torch): points.csv (or
points.jsonl), ceilings.json and run.json when present, and any `report_*.md` section other
modules drop into the folder (included in name order). Both outputs are rendered from one
list of blocks, so the Markdown and HTML tables hold the same numbers.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.analysis import quality
from roofline.analysis.roofs import dtype_table, roofs_for
from roofline.report import plots, regime
from roofline.io.fields import ConfigError
from roofline.io.results import load_run
from roofline.measure.devices import Datasheet, detect
from roofline.model.dtypes import datasheet_column
from roofline.model.formats import QUALITY_NOTE

PROVENANCE_FIELDS = ("device", "device_name", "cpu_model", "torch_version", "triton_version", "python_version",
                     "cuda_version", "driver_version", "sm_clock_mhz", "mem_clock_mhz", "power_limit_w",
                     "threads", "git_commit", "time_utc", "schema_version")
CAPTIONS = {
    "roofline": "Each ok point at its arithmetic intensity and achieved FLOP/s (colour = q, marker = B). "
                "Solid roofs are measured on this device (ceilings.json), dashed ones the datasheet's; "
                "dotted verticals mark the ridges.",
    "step_time_vs_q": "Forward step time vs tokens per sequence per pass (median, p10-p90 band), one line per "
                      "(B, L); dashed: the roofline prediction max(bytes/BW, FLOPs/F). Right: T(q)/T(1), "
                      "the cost of verifying q tokens relative to one decode step.",
    "bandwidth_vs_working_set": "Bandwidth kernels of ceilings.json vs working-set size, per kernel and L2 mode; "
                                "dotted vertical: last-level cache size, dashed: datasheet bandwidth.",
    "utilisation_vs_batch": "Achieved bandwidth and FLOP/s as % of the measured (solid) and datasheet (dashed) "
                            "ceilings, vs batch, at the smallest context measured.",
}

TITLES = {"roofline": "Roofline: achieved FLOP/s vs arithmetic intensity",
          "step_time_vs_q": "Step time and T(q)/T(1) vs q",
          "bandwidth_vs_working_set": "Bandwidth vs working-set size",
          "utilisation_vs_batch": "Utilisation vs batch"}


# ---- reading the run folder ------------------------------------------------------------

def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"results_dir: {path.name} is not valid JSON ({e})") from e


def open_run(run_dir) -> tuple[Path, pd.DataFrame, dict | None, dict | None, Datasheet | None]:
    """(run_dir, points, ceilings, run, datasheet row). Fails fast naming results_dir."""
    if run_dir is None or str(run_dir).strip() in ("", "None"):
        raise ConfigError("results_dir is required: a run folder holding points.csv or points.jsonl")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"results_dir={str(run_dir)!r}: no such folder")
    if not ((run_dir / "points.csv").exists() or (run_dir / "points.jsonl").exists()):
        raise ConfigError(f"results_dir={str(run_dir)!r}: not a run folder (no points.csv or points.jsonl)")
    df = load_run(run_dir)
    if df.empty or not {"dtype", "q", "B", "L", "status"} <= set(df.columns):
        raise ConfigError(f"results_dir={str(run_dir)!r}: points table is empty or lacks the key columns")
    ceilings = _read_json(run_dir / "ceilings.json")
    run = _read_json(run_dir / "run.json")
    datasheet = None
    if not (ceilings or {}).get("datasheet") and "device_name" in df.columns and df["device_name"].notna().any():
        found = detect(str(df["device_name"].dropna().iloc[0]))
        datasheet = found if found is not None and not found.measured_only else None
    return run_dir, df, ceilings, run, datasheet


# ---- tables ----------------------------------------------------------------------------

def _fmt(v) -> str:
    """A table cell: floats to 4 significant digits (a median of a few percent CI has no more), integers whole."""
    if v is None or (isinstance(v, (float, np.floating)) and pd.isna(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return f"{v:.0f}" if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return str(v)


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).map(_fmt) if rows else pd.DataFrame()


def tq_table(df: pd.DataFrame, ceilings: dict | None, datasheet: Datasheet | None) -> pd.DataFrame:
    """T(q)/T(1) per (dtype, B, L) (and model/kind/mode/L2 when they vary), with T(1) and the
    achieved GB/s at q=1 (bytes_total / t_median) and its % of the memory ceilings."""
    ok = plots.ok_rows(df)
    ok = ok[ok["kind"] == "forward"] if "kind" in ok.columns else ok
    if ok.empty:
        return pd.DataFrame()
    cols, groups = plots._series(ok, ["dtype", "B", "L"])
    qs = sorted(ok["q"].unique())
    rows = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = {c.removeprefix("t_"): v for c, v in zip(cols, key)}
        t1 = g.loc[g["q"] == 1, "t_median_s"]
        row["T(1) ms"] = t1.iloc[0] * 1e3 if len(t1) else None
        gbps = g.loc[g["q"] == 1, "achieved_GBps"]
        row["GB/s at q=1"] = gbps.iloc[0] if len(gbps) else None
        roofs = roofs_for(str(row["dtype"]), ceilings, datasheet)
        for name, ceil in (("% measured BW", roofs.bw_measured), ("% datasheet BW", roofs.bw_datasheet)):
            if ceil:
                row[name] = 100 * row["GB/s at q=1"] * 1e9 / ceil if row["GB/s at q=1"] is not None else None
        for q in qs:
            tq = g.loc[g["q"] == q, "t_median_s"]
            row[f"q={q:g}"] = tq.iloc[0] / t1.iloc[0] if len(tq) and len(t1) else None
        rows.append(row)
    return _frame(rows)


def ceilings_table(df: pd.DataFrame, ceilings: dict | None, datasheet: Datasheet | None) -> pd.DataFrame:
    """Measured vs datasheet ceilings, side by side, with measured as % of datasheet."""
    summary = (ceilings or {}).get("summary") or {}
    sheet = (ceilings or {}).get("datasheet") or {}
    dtypes = {datasheet_column(d) for d in plots._values(df, "dtype")}
    dtypes |= set(dtype_table(summary.get("peak_tflops")))
    dtypes |= {d for d, v in dtype_table(sheet.get("peak_tflops")).items() if v}
    rows = []
    first = roofs_for(sorted(dtypes)[0] if dtypes else "bf16", ceilings, datasheet)
    mbw, dbw = first.bw_measured, first.bw_datasheet

    def add(what, unit, m, d, how=""):
        if m is None and d is None:
            return
        rows.append({"ceiling": what, "unit": unit, "measured": m, "datasheet": d,
                     "measured / datasheet %": 100 * m / d if m and d else None, "how measured": how})

    add("memory bandwidth", "GB/s", mbw and mbw / 1e9, dbw and dbw / 1e9, summary.get("mem_bw_kernel") or "")
    for d in sorted(dtypes):
        r = roofs_for(d, ceilings, datasheet)
        add(f"peak {d}", "TFLOP/s", r.flops_measured and r.flops_measured / 1e12,
            r.flops_datasheet and r.flops_datasheet / 1e12, "matmul" if r.flops_measured else "")
        add(f"ridge {d}", "FLOP/B", r.ridge_measured, r.ridge_datasheet, "peak / bandwidth")
    cache_m = summary.get("llc_bytes")  # queried (sysfs / CUDA); cache_bytes is the flush size, not the cache
    cache_d = datasheet.cache_bytes() if datasheet is not None else sheet.get("cache_bytes")
    add("last-level cache", "MiB", cache_m and cache_m / 2**20, cache_d and cache_d / 2**20)
    return _frame(rows)


def percentile_table(df: pd.DataFrame) -> pd.DataFrame:
    """The step time's p50 / p90 / p99 (ms) of every ok full-depth point, and the tail over the median."""
    ok = plots.ok_rows(df)
    if "layers_run" in ok and "layers_full" in ok:
        ok = ok[ok["layers_run"] == ok["layers_full"]]
    if ok.empty or "t_median_s" not in ok:
        return pd.DataFrame()
    col = lambda c: ok[c].astype(float) * 1e3 if c in ok else pd.Series(np.nan, ok.index)  # noqa: E731
    rows = pd.DataFrame({"point": ok.get("point_id", ok.index.astype(str)), "p50 ms": col("t_median_s"),
                         "p90 ms": col("t_p90_s"), "p99 ms": col("t_p99_s")})
    rows["p99 / p50"] = rows["p99 ms"] / rows["p50 ms"]
    return _frame(rows.to_dict("records"))


def failed_table(df: pd.DataFrame) -> pd.DataFrame:
    bad = df[df["status"] != "ok"]
    cols = [c for c in ("point_id", "kind", "model", "dtype", "mode", "q", "B", "L", "status", "error")
            if c in bad.columns]
    out = bad[cols].copy()
    if "error" in out.columns:
        out["error"] = out["error"].astype(str).str.slice(0, 200)
    return out.map(_fmt)


def provenance_table(df: pd.DataFrame, ceilings: dict | None) -> pd.DataFrame:
    prov = (ceilings or {}).get("provenance") or {}
    rows = []
    for f in PROVENANCE_FIELDS:
        vals = sorted(plots._values(df, f))
        if f == "time_utc" and len(vals) > 1:
            vals = [f"{vals[0]} to {vals[-1]}"]
        if vals or f in prov:
            row = {"field": f, "points": ", ".join(vals)}
            if ceilings is not None:
                row["ceilings.json"] = prov.get(f)
            rows.append(row)
    return _frame(rows)


# ---- the document ----------------------------------------------------------------------

def build_blocks(run_dir: Path, df, ceilings, run, datasheet, figures: plots.FigureSet) -> list[tuple]:
    """The report as blocks: ("h", level, text), ("p", text), ("table", frame), ("img", alt,
    path relative to run_dir), ("code", text), ("md", raw markdown), ("details", summary,
    [blocks folded under it]), ("toc",) (the contents, filled in by render_md)."""
    n_ok = int((df["status"] == "ok").sum())
    models = ", ".join(plots._values(df, "model")) or "?"
    warnings = regime.roof_violations(df) + regime.ceilings_warnings(ceilings) + quality.run_warnings(run_dir, df)
    b: list[tuple] = [("h", 1, f"Roofline report: {run_dir.name}"),
                      ("p", f"**Key figure:** {quality.key_figure(df, ceilings)}."),
                      *[("p", f"**Regime:** {line}.") for line in regime.headline(df)],
                      *[("p", f"**Decode:** {line}.") for line in regime.decode_notes(df, ceilings)],
                      *[("p", f"**Compile:** {line}.") for line in regime.compile_notes(df)],
                      *[("p", f"**Precision and mode:** {why}") for why in _auto_choice(run)],
                      ("toc",),
                      ("h", 2, "Warnings"),
                      ("md", "\n".join(f"- {w}" for w in warnings)) if warnings
                      else ("p", "None: every point ok and converged, no fit problems."),
                      ("p", f"Model {models}; {len(df)} points, {n_ok} ok, {len(df) - n_ok} failed. "
                            "GB/s count 1 GB = 1e9 B of bytes_total (weights + KV read/write + embedding rows) "
                            "over the median step time.")]
    if any("+" in d for d in plots._values(df, "dtype")):  # quantized precisions (roofline.model.formats)
        b.append(("p", f"Quantized rows: bytes are the formats' exact bytes, scales and zero points included. "
                       f"Note: {QUALITY_NOTE}."))
    b.append(("h", 2, "Figures"))
    for name, paths in figures.paths.items():
        pngs = [p for p in paths if p.suffix == ".png"]
        for png in pngs:
            title = TITLES.get(name, name.replace("_", " ").capitalize())
            if len(pngs) > 1:
                title += f" ({png.stem.removeprefix(name).strip('_-').replace('_', ' ')})"
            b += [("h", 3, title), ("img", png.stem, png.relative_to(run_dir).as_posix()),
                  ("p", CAPTIONS.get(name, "") + f" (SVG: `{png.with_suffix('.svg').relative_to(run_dir).as_posix()}`)")]
    for name, why in figures.skipped.items():
        b.append(("p", f"Figure `{name}` not drawn: {why}."))
    b.append(("h", 2, "Step time vs tokens per pass: T(q)/T(1)"))
    tq = tq_table(df, ceilings, datasheet)
    b.append(("p", "Forward points. Columns `q=n`: T(n)/T(1), the median step time at n tokens per sequence "
                   "over the one at q=1 (1 = verifying n tokens costs one decode step). T(1) in ms; GB/s at q=1"
                   + (" and its % of the memory ceilings (measured, datasheet)." if "%" in " ".join(tq.columns)
                      else ".")))
    b.append(("table", tq) if not tq.empty else ("p", "No ok forward points."))
    pt = percentile_table(df)
    if not pt.empty:
        tail = pd.to_numeric(pt["p99 / p50"], errors="coerce")
        b += [("h", 2, "Step-time percentiles: p50, p90, p99"),
              ("p", f"Every ok full-depth point's step time at its median (p50), 90th and 99th percentile of the "
                    f"timed repetitions, in ms. p99 / p50: median {tail.median():.3g}, worst {tail.max():.3g}."
                    if tail.notna().any() else "Every ok full-depth point's step time percentiles, in ms."),
              ("details", f"The {len(pt)} points", [("table", pt)])]
    knees = regime.knee_table(df)
    if not knees.empty:
        b += [("h", 2, "The knee: predicted by the ceilings, measured"),
              ("p", "Where verification stops being free, per (dtype, mode, B, L): the knee predicted by the measured "
                    "ceilings (ridge / intensity of the q=1 pass, tokens per sequence) beside the knee of the measured "
                    "T(q)/T(1) (hinge fit); ratio_at_probe = T(probe_q)/T(1)."), ("table", knees.round(3))]
    b.append(("h", 2, "Ceilings: measured vs datasheet"))
    if ceilings is None:
        b.append(("p", "No ceilings.json in this run folder: no measured ceilings (run roofline.measure.ceilings on the "
                       "same device)." + ("" if datasheet else " No datasheet row for this device either.")))
    ct = ceilings_table(df, ceilings, datasheet)
    if not ct.empty:
        b.append(("table", ct))
    b.append(("h", 2, "Failed points"))
    ft = failed_table(df)
    b.append(("table", ft) if not ft.empty else ("p", f"None: all {len(df)} points ok."))
    b.append(("h", 2, "Provenance"))
    b.append(("table", provenance_table(df, ceilings)))
    if run is not None:
        b += [("h", 2, "Run configuration"),
              ("details", "run.json (what was asked: grid, timer, model, code version)",
               [("code", json.dumps(run, indent=2, default=str))])]
    for extra in sorted(run_dir.glob("report_*.md")):
        b.append(("md", extra.read_text()))
    return b


def _auto_choice(run: dict | None) -> list[str]:
    """Why the sweep ran the precision and mode it did (dtypes=[auto]: run.json's spec.auto_choice)."""
    why = ((run or {}).get("spec") or {}).get("auto_choice") or ""
    return [why] if why else []


def md_table(frame: pd.DataFrame) -> str:
    """A pipe table, every cell formatted to its precision (_fmt)."""
    cell = lambda v: _fmt(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(str(c).replace("|", "\\|") for c in frame.columns) + " |",
             "|" + "|".join("---" for _ in frame.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def slug(text: str) -> str:
    """A heading's anchor as GitHub makes it (lower case, punctuation dropped, spaces to '-')."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text.strip().lower()))


def _headings(blocks: list[tuple]) -> list[tuple[int, str]]:
    out = []
    for kind, *a in blocks:
        if kind == "h":
            out.append((a[0], a[1]))
        elif kind == "md":
            out += [(len(m.group(1)), m.group(2).strip()) for m in re.finditer(r"^(#{1,6})\s+(.*)$", a[0], re.M)]
    return out


def _toc(blocks: list[tuple]) -> str:
    seen: dict[str, int] = {}
    lines = ["**Contents**", ""]
    for level, text in _headings(blocks):
        s = slug(text)
        n = seen.get(s, 0)
        seen[s] = n + 1
        if level == 2:
            lines.append(f"- [{text}](#{s if n == 0 else f'{s}-{n}'})")
    return "\n".join(lines)


def render_md(blocks: list[tuple], _toc_of: list[tuple] | None = None) -> str:
    out = []
    for kind, *a in blocks:
        if kind == "h":
            out.append("#" * a[0] + " " + a[1])
        elif kind == "p":
            out.append(a[0])
        elif kind == "table":
            out.append(md_table(a[0]))
        elif kind == "img":
            out.append(f"![{a[0]}]({a[1]})")
        elif kind == "code":
            out.append("```json\n" + a[0] + "\n```")
        elif kind == "md":
            out.append(a[0].strip())
        elif kind == "toc":
            out.append(_toc(_toc_of or blocks))
        elif kind == "details":  # folded: GitHub and the HTML report both open it on a click
            out.append(f"<details><summary>{html.escape(a[0])}</summary>\n\n"
                       + render_md(a[1], _toc_of or blocks).strip() + "\n\n</details>")
    return "\n\n".join(out) + "\n"


CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
       "table{border-collapse:collapse;margin:1em 0;font-size:0.85em;display:block;overflow-x:auto}"
       "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}th{background:#f3f3f3}"
       "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
       "details{margin:1em 0}summary{cursor:pointer;color:#035}"
       "pre{background:#f6f6f6;padding:0.8em;overflow:auto;font-size:0.8em}code{background:#f3f3f3}")


def _img(run_dir: Path, alt: str, rel: str) -> str:
    path = run_dir / rel
    if path.suffix.lower() != ".png" or not path.exists():
        return f"<em>image not embedded: {html.escape(rel)}</em>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _heading_ids(state) -> None:
    """id= on every heading, as slug() and GitHub make them (the contents link to them)."""
    seen: dict[str, int] = {}
    for i, tok in enumerate(state.tokens):
        if tok.type == "heading_open":
            s = slug(state.tokens[i + 1].content)
            n = seen.get(s, 0)
            seen[s] = n + 1
            tok.attrSet("id", s if n == 0 else f"{s}-{n}")


def markdown_to_html(text: str, run_dir: Path) -> str:
    """CommonMark + pipe tables by markdown-it-py; headings get GitHub's anchors, images are
    embedded (base64 PNG), raw HTML (<details>) passes through (the text is the report's own)."""
    from markdown_it import MarkdownIt
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.core.ruler.push("heading_ids", _heading_ids)
    md.add_render_rule("image", lambda self, tokens, idx, options, env: _img(
        run_dir, self.renderInlineAsText(tokens[idx].children, options, env), tokens[idx].attrGet("src")))
    return md.render(text)


def render_html(blocks: list[tuple], run_dir: Path, title: str) -> str:
    """The Markdown of render_md, rendered: one document, the same numbers in both."""
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + markdown_to_html(render_md(blocks), run_dir)
            + "\n</body></html>\n")


def write_figures(run_dir, out_dir=None) -> plots.FigureSet:
    """Every figure of a run folder into out_dir (default run_dir/figures/)."""
    run_dir, df, ceilings, _, datasheet = open_run(run_dir)
    return plots.plot_all(df, ceilings, datasheet, Path(out_dir) if out_dir else run_dir / "figures")


def write_report(run_dir) -> tuple[Path, Path]:
    """Figures into run_dir/figures/, then run_dir/report.md and run_dir/report.html."""
    run_dir, df, ceilings, run, datasheet = open_run(run_dir)
    figures = plots.plot_all(df, ceilings, datasheet, run_dir / "figures")
    blocks = build_blocks(run_dir, df, ceilings, run, datasheet, figures)
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    md_path.write_text(render_md(blocks))
    html_path.write_text(render_html(blocks, run_dir, f"Roofline report: {run_dir.name}"))
    return md_path, html_path
