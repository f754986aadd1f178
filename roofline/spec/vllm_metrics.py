"""Speculative-decoding acceptance from a vLLM server's Prometheus /metrics dump.

vLLM (v1 engine, vllm/v1/spec_decode/metrics.py) counts, per engine and model:

    vllm:spec_decode_num_drafts            rounds in which a draft was proposed
    vllm:spec_decode_num_draft_tokens      tokens drafted (<= k per round)
    vllm:spec_decode_num_accepted_tokens   drafted tokens the target accepted
    vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}
                                           rounds whose draft position i (0-based) was accepted

prometheus_client exposes each counter as `<name>_total` (plus a `<name>_created`
timestamp, which is not a count), labelled with model_name and engine. Acceptance is a
property of the (target, drafter, workload) triple, not of the server, so counters are
summed over engines and, unless one is named, over models. Counters only grow: measure a
benchmark as `diff(before, after)` of two dumps taken around it.

The per-position counters are what the speedup model needs: position i is accepted only
if every earlier one was, so accepted_pos_i / drafts is the survival s_{i+1} and
accepted_pos_i / accepted_pos_{i-1} the conditional alpha_{i+1} of roofline.model.speculation.
"""

from __future__ import annotations

import math
import re
from typing import Union

from roofline.io.fields import ConfigError
from roofline.spec.counters import AcceptanceCounters

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_POS)

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,?)')
_UNESCAPE = re.compile(r"\\(.)")


class SpecDecodeMetricsError(ConfigError):
    """The dump cannot give spec-decode counters: says what is missing or inconsistent (bad
    input: the commands exit 2 with it)."""


# a Prometheus counter is a float64: above 2**53 whole counts are no longer exact, and no
# benchmark drafts that many tokens; such a value is a corrupted dump, not a count
MAX_COUNT = 2 ** 53


def check_consistent(c: "AcceptanceCounters") -> "AcceptanceCounters":
    """Refuse counters that no vLLM server can produce, naming the counters: more tokens
    accepted than drafted; a per-position series whose sum is not the accepted total, that
    grows with the position (acceptance stops at the first rejection), or whose position 0
    exceeds the number of drafts; more draft tokens than drafts x k."""
    k = c.num_positions
    if c.accepted_tokens > c.draft_tokens:
        raise SpecDecodeMetricsError(f"{ACCEPTED_TOKENS}={c.accepted_tokens} > {DRAFT_TOKENS}={c.draft_tokens}: "
                                     "more tokens accepted than drafted")
    if k and c.draft_tokens > c.drafts * k:
        raise SpecDecodeMetricsError(f"{DRAFT_TOKENS}={c.draft_tokens} > {DRAFTS}={c.drafts} x k={k}: "
                                     "more draft tokens than rounds of k")
    if k and sum(c.accepted_per_pos) != c.accepted_tokens:
        raise SpecDecodeMetricsError(f"the {ACCEPTED_PER_POS} series sums to {sum(c.accepted_per_pos)}, "
                                     f"{ACCEPTED_TOKENS} is {c.accepted_tokens}: they must agree")
    if k and c.accepted_per_pos[0] > c.drafts:
        raise SpecDecodeMetricsError(f"{ACCEPTED_PER_POS}{{position=0}}={c.accepted_per_pos[0]} > "
                                     f"{DRAFTS}={c.drafts}: more first drafts accepted than drafted")
    grows = [i for i in range(1, k) if c.accepted_per_pos[i] > c.accepted_per_pos[i - 1]]
    if grows:
        i = grows[0]
        raise SpecDecodeMetricsError(
            f"{ACCEPTED_PER_POS}{{position={i}}}={c.accepted_per_pos[i]} > position {i - 1}'s "
            f"{c.accepted_per_pos[i - 1]}: a draft is accepted only after every one before it")
    return c


def _sample(line: str, lineno: int) -> tuple[str, dict[str, str], float]:
    """One exposition line `name{label="value",...} value [timestamp]`."""
    m = _NAME.match(line)
    if m is None:
        raise SpecDecodeMetricsError(f"line {lineno}: no metric name in {line!r}")
    name, pos, labels = m.group(), m.end(), {}
    if line[pos:pos + 1] == "{":
        pos += 1
        while True:
            if line[pos:].lstrip().startswith("}"):
                pos = line.index("}", pos) + 1
                break
            lm = _LABEL.match(line, pos)
            if lm is None:
                raise SpecDecodeMetricsError(f"line {lineno}: bad label set in {line!r}")
            labels[lm.group(1)] = _UNESCAPE.sub(
                lambda e: "\n" if e.group(1) == "n" else e.group(1), lm.group(2))
            pos = lm.end()
            if not lm.group(3) and not line[pos:].lstrip().startswith("}"):
                raise SpecDecodeMetricsError(f"line {lineno}: bad label set in {line!r}")
    fields = line[pos:].split()
    if len(fields) not in (1, 2):
        raise SpecDecodeMetricsError(f"line {lineno}: expected a value in {line!r}")
    try:
        value = float(fields[0])
    except ValueError:
        raise SpecDecodeMetricsError(f"line {lineno}: value {fields[0]!r} is not a number")
    return name, labels, value


def _count(value: float, name: str) -> int:
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise SpecDecodeMetricsError(f"{name} must be a non-negative whole count, got {value}")
    if value > MAX_COUNT:
        raise SpecDecodeMetricsError(f"{name}={value:g} is above 2**53: not a count a server reached")
    return int(value)


def _base_name(name: str) -> tuple[str, bool] | None:
    """(counter, has `_total` suffix) for our counters; None for any other series."""
    for counter in COUNTERS:
        if name == counter:
            return counter, False
        if name == counter + "_total":
            return counter, True
    return None


def parse_spec_decode(text: str, model_name: str | None = None) -> AcceptanceCounters:
    """Spec-decode counters from a /metrics text dump.

    Accepts the counter names with or without the `_total` suffix (with it preferred when a
    dump holds both), any extra labels, and HELP/TYPE/comment lines and unrelated series,
    which are ignored. `model_name` keeps only that model's series.
    """
    found: dict[tuple[str, bool], list[tuple[dict[str, str], float]]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, labels, value = _sample(line, lineno)
        key = _base_name(name)
        if key is not None:
            found.setdefault(key, []).append((labels, value))
    if not found:
        raise SpecDecodeMetricsError(
            "no vLLM spec-decode counters (" + ", ".join(COUNTERS) + ") in the dump: "
            "was the server started with speculative decoding (--speculative-config)?")
    if model_name is not None:
        models = sorted({labels.get("model_name", "") for series in found.values()
                         for labels, _ in series})
        found = {key: [(labels, v) for labels, v in series
                       if labels.get("model_name") == model_name]
                 for key, series in found.items()}
        if not any(found.values()):
            raise SpecDecodeMetricsError(
                f"model_name={model_name!r} has no spec-decode counters; the dump has {models}")

    def series(counter: str) -> list[tuple[dict[str, str], float]]:
        return found.get((counter, True)) or found.get((counter, False)) or []

    missing = [c for c in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS) if not series(c)]
    if missing:
        raise SpecDecodeMetricsError(f"the dump lacks {missing}: a truncated dump, or a vLLM "
                                     "version without these counters")
    totals = {c: _count(sum(v for _, v in series(c)), c)
              for c in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS)}
    per_pos: dict[int, float] = {}
    for labels, value in series(ACCEPTED_PER_POS):
        position = labels.get("position", "")
        if not position.isdigit():
            raise SpecDecodeMetricsError(f"{ACCEPTED_PER_POS} needs an integer position "
                                         f"label, got labels {labels}")
        per_pos[int(position)] = per_pos.get(int(position), 0.0) + value
    if sorted(per_pos) != list(range(len(per_pos))):
        raise SpecDecodeMetricsError(f"{ACCEPTED_PER_POS} positions must be 0..k-1, "
                                     f"got {sorted(per_pos)}")
    return check_consistent(AcceptanceCounters(
        drafts=totals[DRAFTS], draft_tokens=totals[DRAFT_TOKENS],
        accepted_tokens=totals[ACCEPTED_TOKENS],
        accepted_per_pos=tuple(_count(per_pos[i], f"{ACCEPTED_PER_POS}{{position={i}}}")
                               for i in range(len(per_pos)))))


Dump = Union[str, AcceptanceCounters]


def diff(before: Dump, after: Dump, model_name: str | None = None) -> AcceptanceCounters:
    """Counts accumulated between two dumps (text or parsed) taken around a benchmark."""
    b, a = (parse_spec_decode(d, model_name) if isinstance(d, str) else d
            for d in (before, after))
    if b.num_positions != a.num_positions:
        raise SpecDecodeMetricsError(f"before has {b.num_positions} draft positions, after "
                                     f"{a.num_positions}: not the same server configuration")
    delta = AcceptanceCounters(
        drafts=a.drafts - b.drafts, draft_tokens=a.draft_tokens - b.draft_tokens,
        accepted_tokens=a.accepted_tokens - b.accepted_tokens,
        accepted_per_pos=tuple(x - y for x, y in zip(a.accepted_per_pos, b.accepted_per_pos)))
    if min((delta.drafts, delta.draft_tokens, delta.accepted_tokens)
           + delta.accepted_per_pos) < 0:
        raise SpecDecodeMetricsError(f"a counter went backwards ({delta}): was the server "
                                     "restarted between the two dumps, or are they swapped?")
    return check_consistent(delta)
