"""Detection quality on the scenario suite (:mod:`.scenarios`), per scenario and overall.

    python -m neuraldbg_track.quality                  # every scenario, the default thresholds
    python -m neuraldbg_track.quality --set patience=2 --set hysteresis=0 --only dead_relu_bias_shift
    neuraldbg-track quality --json
    python -m neuraldbg_track.quality --sweep          # the overall figures for each value in SWEEP

Figures (exit status 1 when a target is missed):

* recall: each expected (layer, state) entered by an event of that layer, type and state (target 100%);
* false events: any event of a healthy run; in a failure run, a failure the scenario neither expects
  nor lists as a consequence (target 0 on the healthy baselines);
* events per real change, on the expected layers: events / distinct states entered, so a state left
  and entered again (flapping) counts above 1 (target <= 1);
* latency: steps from the step the fault first met the forward pass to the event (target <= patience + 1);
* confidence of true (expected) vs false events (target: every true event above every false one);
* reasoner: the top hypothesis names the injected cause and, where the fault was injected in one
  place, a layer of that block as root (target >= 90% of failure scenarios); healthy runs get one
  "no failure found" hypothesis.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from .config import ConfigError, thresholds_from
from .events import SemanticEvent
from .scenarios import SCENARIOS, Scenario, ScenarioRun, run_scenario

REASONER_TARGET = 0.9
#: Settings ``--sweep`` compares with the defaults: why each default is what it is.
SWEEP: tuple[dict[str, Any], ...] = (
    {}, {"patience": 1}, {"patience": 2}, {"patience": 5}, {"hysteresis": 0.0}, {"hysteresis": 1.0},
    {"anomaly_decades": 0.5}, {"anomaly_decades": 2.0}, {"dead_fraction": 0.8}, {"dead_fraction": 0.95},
    {"saturated_fraction": 0.3}, {"saturated_fraction": 0.9}, {"vanishing": 1e-7}, {"exploding": 1e4})


@dataclass
class ScenarioScore:
    name: str
    family: str
    healthy: bool
    expected: int
    found: int
    missed: list[str]
    false_events: list[SemanticEvent]
    events_per_change: float | None
    latency: int | None
    latency_bound: int
    true_confidence: list[float]
    top: Any
    cause_ok: bool
    root_ok: bool | None  # None: the fault is global, the root is not scored

    @property
    def reasoner_ok(self) -> bool:
        return self.cause_ok and self.root_ok is not False

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.name, "family": self.family, "healthy": self.healthy, "expected": self.expected,
                "found": self.found, "missed": self.missed, "false_events": [e.to_dict() for e in self.false_events],
                "events_per_change": self.events_per_change, "latency": self.latency,
                "latency_bound": self.latency_bound, "true_confidence": self.true_confidence,
                "top_hypothesis": self.top.to_dict() if self.top is not None else None,
                "cause_ok": self.cause_ok, "root_ok": self.root_ok}


def score(run: ScenarioRun) -> ScenarioScore:
    """Compare one scenario's events and hypotheses with its ground truth."""
    s: Scenario = run.scenario
    found, missed, latencies, confidences = 0, [], [], []
    tracks: set[tuple[str, str]] = set()
    for expect in s.expect:
        for layer in expect.layers:
            tracks.add((layer, expect.event_type))
            hit = next((e for e in run.events if (e.layer_name, e.event_type, e.to_state)
                        == (layer, expect.event_type, expect.state)), None)
            if hit is None:
                missed.append(f"{layer} {expect.state}")
                continue
            found += 1
            confidences.append(hit.confidence)
            if expect.onset is not None:
                latencies.append(hit.step - expect.onset)
    allowed = {x.state for x in s.expect} | set(s.also)
    false = list(run.events) if s.healthy else [e for e in run.events if e.is_failure and e.to_state not in allowed]
    ratios = []
    for layer, event_type in tracks:
        on_track = [e for e in run.events if (e.layer_name, e.event_type) == (layer, event_type)]
        if on_track:
            ratios.append(len(on_track) / len({e.to_state for e in on_track}))
    top = run.hypotheses[0] if run.hypotheses else None
    cause_ok = top is not None and top.cause == (s.cause or "none") and (not s.healthy or len(run.hypotheses) == 1)
    root_ok = (top is not None and top.root_layer in s.root) if s.root else None
    return ScenarioScore(s.name, s.family, s.healthy, sum(len(x.layers) for x in s.expect), found, missed, false,
                         max(ratios) if ratios else None, max(latencies) if latencies else None,
                         run.patience + 1, confidences, top, cause_ok, root_ok)


@dataclass
class Report:
    scores: list[ScenarioScore]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def overall(self) -> dict[str, Any]:
        failures = [s for s in self.scores if not s.healthy]
        healthy = [s for s in self.scores if s.healthy]
        expected, found = sum(s.expected for s in failures), sum(s.found for s in failures)
        false_all = [e for s in self.scores for e in s.false_events]
        true_conf = [c for s in self.scores for c in s.true_confidence]
        ratios = [s.events_per_change for s in failures if s.events_per_change is not None]
        lat = [(s.latency, s.latency_bound) for s in failures if s.latency is not None]
        right = sum(s.reasoner_ok for s in failures)
        return {
            "recall": found / expected if expected else 1.0, "expected": expected, "found": found,
            "false_events_healthy": sum(len(s.false_events) for s in healthy),
            "false_events_failure_runs": sum(len(s.false_events) for s in failures),
            "max_events_per_change": max(ratios, default=None),
            "max_latency": max((l for l, _ in lat), default=None),
            "latency_bound": max((b for _, b in lat), default=None),
            "latency_within_bound": all(l <= b for l, b in lat),
            "true_confidence_min": min(true_conf, default=None),
            "true_confidence_mean": sum(true_conf) / len(true_conf) if true_conf else None,
            "false_confidence_max": max((e.confidence for e in false_all), default=None),
            "reasoner_right": right, "reasoner_scenarios": len(failures),
            "reasoner_accuracy": right / len(failures) if failures else 1.0,
            "healthy_no_failure_found": sum(s.cause_ok for s in healthy), "healthy_runs": len(healthy),
        }

    @property
    def targets_met(self) -> dict[str, bool]:
        o = self.overall
        false_max, true_min = o["false_confidence_max"], o["true_confidence_min"]
        return {"recall 100%": o["recall"] == 1.0, "no false event on healthy runs": o["false_events_healthy"] == 0,
                "<= 1 event per real change": (o["max_events_per_change"] or 1.0) <= 1.0,
                "latency <= patience + 1": o["latency_within_bound"],
                "true events above false ones": false_max is None or (true_min or 0.0) > false_max,
                f"reasoner >= {REASONER_TARGET:.0%}": o["reasoner_accuracy"] >= REASONER_TARGET,
                "healthy runs: no failure found": o["healthy_no_failure_found"] == o["healthy_runs"]}

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "overall": self.overall, "targets": self.targets_met,
                "scenarios": [s.to_dict() for s in self.scores]}

    def render(self) -> str:
        rows = [("scenario", "recall", "false", "ev/chg", "latency", "conf", "top hypothesis (cause @ root)", "")]
        for s in self.scores:
            conf = f"{min(s.true_confidence):.2f}" if s.true_confidence else "-"
            top = f"{s.top.cause} @ {s.top.root_layer}" if s.top is not None else "-"
            verdict = "ok" if s.reasoner_ok else "WRONG"
            verdict += "" if s.root_ok is not None or s.healthy else " (root unscored)"
            rows.append((s.name, "-" if s.healthy else f"{s.found}/{s.expected}", str(len(s.false_events)),
                         "-" if s.events_per_change is None else f"{s.events_per_change:.2f}",
                         "-" if s.latency is None else f"{s.latency} (<={s.latency_bound})", conf, top, verdict))
        lines = _table(rows).split("\n")
        lines.insert(1, "-" * len(lines[0]))
        o = self.overall
        lines += ["", f"recall: {o['found']}/{o['expected']} = {o['recall']:.0%}",
                  (f"false events: {o['false_events_healthy']} on {o['healthy_runs']} healthy runs, "
                   f"{o['false_events_failure_runs']} unexplained in failure runs"),
                  f"events per real change: max {_fmt(o['max_events_per_change'])}",
                  (f"latency: max {_fmt(o['max_latency'], '')} steps "
                   f"(bound patience + 1 = {_fmt(o['latency_bound'], '')})"),
                  (f"confidence: true events min {_fmt(o['true_confidence_min'])}, "
                   f"mean {_fmt(o['true_confidence_mean'])}; false events max {_fmt(o['false_confidence_max'])}"),
                  (f"reasoner: top hypothesis right in {o['reasoner_right']}/{o['reasoner_scenarios']} failure "
                   f"scenarios ({o['reasoner_accuracy']:.0%}); 'no failure found' on "
                   f"{o['healthy_no_failure_found']}/{o['healthy_runs']} healthy runs"), ""]
        lines += [f"[{'met' if ok else 'MISSED'}] {name}" for name, ok in self.targets_met.items()]
        return "\n".join(lines)


def evaluate(names: Sequence[str] | None = None, thresholds: dict[str, Any] | None = None) -> Report:
    """Run the scenarios (all, or ``names``) with ``thresholds`` overrides and score them."""
    unknown = sorted(set(names or ()) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    th = thresholds_from(thresholds or {})
    chosen = [SCENARIOS[n] for n in (names or SCENARIOS)]
    return Report([score(run_scenario(s, thresholds=th)) for s in chosen], dict(thresholds or {}))


def sweep(settings: Sequence[dict[str, Any]] = SWEEP, names: Sequence[str] | None = None) -> str:
    """One line of overall figures per setting (each a set of threshold overrides; {} = the defaults)."""
    head = ("setting", "recall", "false(healthy)", "false(other)", "ev/chg", "latency", "true min", "false max",
            "reasoner", "targets")
    rows = [head]
    for setting in settings:
        report = evaluate(names, dict(setting))
        o, missed = report.overall, [k for k, ok in report.targets_met.items() if not ok]
        rows.append((", ".join(f"{k}={v}" for k, v in setting.items()) or "defaults", f"{o['recall']:.0%}",
                     str(o["false_events_healthy"]), str(o["false_events_failure_runs"]),
                     _fmt(o["max_events_per_change"]), f"{_fmt(o['max_latency'], '')}/{_fmt(o['latency_bound'], '')}",
                     _fmt(o["true_confidence_min"]), _fmt(o["false_confidence_max"]),
                     f"{o['reasoner_accuracy']:.0%}", "all met" if not missed else f"{len(missed)} missed"))
    return _table(rows)


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _setting(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected KEY=VALUE, e.g. --set patience=2")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"--set {text!r}: the value must be a number, e.g. 1e-6") from None


def main(argv: Sequence[str] | None = None, prog: str = "python -m neuraldbg_track.quality") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Detection quality on the scenario suite.")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios")
    parser.add_argument("--set", dest="settings", action="append", type=_setting, default=[], metavar="KEY=VALUE",
                        help="override a threshold (a Thresholds field), e.g. --set patience=2")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--sweep", action="store_true", help="overall figures for each setting in SWEEP")
    args = parser.parse_args(argv)
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.name:<40} {s.family:<12} {s.description}")
        return 0
    try:
        if args.sweep:
            print(sweep([{**s, **dict(args.settings)} for s in SWEEP], args.only))
            return 0
        report = evaluate(args.only, dict(args.settings))
    except (ValueError, ConfigError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return 0 if all(report.targets_met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
