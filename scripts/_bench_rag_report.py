"""bench_rag's report: the Markdown tables, the PASS/FAIL verdicts, and the machine they ran on.

Private to ``scripts/bench_rag.py``, which puts the repository on ``sys.path`` before importing it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from _bench_rag_servers import LevelResult


def report(raw: dict[str, Any], levels: list[LevelResult], memory: dict[str, float], load: str,
           setup: str = "") -> tuple[str, list[str]]:
    """The Markdown table and the PASS/FAIL lines of a run."""
    ceiling = raw["ceiling_qps"]
    ours = {(r.mix, r.concurrency): r for r in levels if r.system == "this server"}
    anchor = {(r.mix, r.concurrency): r for r in levels if r.system.startswith("rLLM")}
    anchor_name = next((r.system for r in levels if r.system.startswith("rLLM")), "anchor (not run)")
    others = list(dict.fromkeys(r.system for r in levels
                                if r.system != "this server" and not r.system.startswith("rLLM")))
    other = {name: {(r.mix, r.concurrency): r for r in levels if r.system == name} for name in others}
    lines = [*([setup, ""] if setup else []),
        f"In-process ceiling (encode + search, batch {raw['best_batch']}"
        + (f" x {raw['best_streams']} side by side" if raw["best_streams"] > 1 else "")
        + ", the higher of before and after the "
        f"servers ran): **{ceiling:.1f} q/s**; one lone query: **{raw['single_ms']:.1f} ms** (median). "
        f"Machine load (1-min average) at start / end: {load}.",
        "",
        f"| queries | c | {anchor_name} q/s | this server q/s | vs ceiling | vs anchor | p50 ms (anchor / this) "
        "| p99 ms this | mean batch | server CPU ms/q | wrk CPU (share of a core) | errors (anchor / this) |"
        + "".join(f" {name} q/s | this vs it |" for name in others),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(others),
    ]
    for (mix, c), r in sorted(ours.items(), key=lambda kv: (kv[0][0] != "distinct", kv[0][1])):
        a = anchor.get((mix, c))
        a_qps = f"{a.qps:.1f}" if a else "-"
        vs_a = f"{r.qps / a.qps:.2f}x" if a and a.qps else "-"
        a_p50 = f"{a.p50_ms:.0f}" if a else "-"
        a_err = str(a.errors) if a else "-"
        lines.append(f"| {mix} | {c} | {a_qps} | {r.qps:.1f} | {r.qps / ceiling:.0%} | {vs_a} | {a_p50} / "
                     f"{r.p50_ms:.0f} | {r.p99_ms:.0f} | {r.mean_batch:.1f} | {r.server_cpu_ms:.2f} | "
                     f"{r.client_cpu_share:.0%} | {a_err} / {r.errors} |"
                     + "".join(_base_cells(other[name].get((mix, c)), r) for name in others)
                     + (f" {r.note}" if r.note else ""))
    checks: list[tuple[str, bool | None, str]] = []
    for c in (256, 512):
        r = ours.get(("distinct", c))
        if r is None:
            continue
        checks.append((f"distinct c={c} >= 85% of ceiling", r.qps >= 0.85 * ceiling, f"{r.qps / ceiling:.0%}"))
        a = anchor.get(("distinct", c))
        checks.append((f"distinct c={c} >= 1.15x anchor", (r.qps >= 1.15 * a.qps) if a else None,
                       f"{r.qps / a.qps:.2f}x" if a else "anchor not run"))
    r = ours.get(("distinct", 1))
    if r is not None:
        checks.append(("c=1 p50 <= 1.2x one raw query", r.p50_ms <= 1.2 * raw["single_ms"],
                       f"{r.p50_ms / raw['single_ms']:.2f}x of {raw['single_ms']:.1f} ms"))
    for c in (16, 64):
        r, a = ours.get(("distinct", c)), anchor.get(("distinct", c))
        if r is not None:
            checks.append((f"distinct c={c} ahead of anchor", (r.qps > a.qps) if a else None,
                           f"{r.qps / a.qps:.2f}x" if a else "anchor not run"))
    r = ours.get(("distinct", 1024))
    if r is not None:  # issue 13's target on a GPU node
        checks.append(("distinct c=1024 >= 80% of ceiling", r.qps >= 0.8 * ceiling, f"{r.qps / ceiling:.0%}"))
    r, d = ours.get(("rl-mix", 256)), ours.get(("distinct", 256))
    if r is not None and d is not None:
        checks.append(("rl-mix c=256 >= 6x distinct c=256", r.qps >= 6 * d.qps, f"{r.qps / d.qps:.2f}x"))
    if ours:
        checks.append(("zero errors (this server)", all(r.errors == 0 for r in ours.values()),
                       str(sum(r.errors for r in ours.values()))))
    verdicts = [f"{'PASS' if ok else 'FAIL' if ok is False else 'SKIP'}  {name}: {value}" for name, ok, value in checks]
    lines += ["", "Ceiling sweep (q/s by batch size): "
              + ", ".join(f"{bs}: {q:.1f}" for bs, q in raw["sweep_qps"].items())
              + ("; {} batches side by side: ".format(raw["streams"])
                 + ", ".join(f"{bs}: {q:.1f}" for bs, q in raw["parallel_sweep_qps"].items())
                 if raw["parallel_sweep_qps"] else ""),
              f"Corpus memory: {memory}"]
    return "\n".join(lines), verdicts


def _base_cells(b: LevelResult | None, r: LevelResult) -> str:
    if b is None:
        return " - | - |"
    return f" {b.qps:.1f} (errors {b.errors}) | {r.qps / b.qps:.2f}x |"


def load_average() -> str:
    """The 1-minute load average, for the record of how busy the machine was."""
    return f"{os.getloadavg()[0]:.2f}"


def environment() -> dict[str, Any]:
    """Versions and the accelerator, for the record."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    for name in ("torch", "faiss", "transformers", "sentence_transformers", "granian", "fastapi", "pydantic"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            env[name] = None
    try:
        import torch

        env["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        env["cuda"] = []
    return env


def scale_report(results: list[dict[str, Any]]) -> list[str]:
    """The ``--scale-search`` table and its best rows, as Markdown lines."""
    lines = ["", "Search alone on synthetic vectors (random, exact flat inner product; cost depends only on N x dim), "
             "and the ceiling estimated at that size (encode + search per batch, serially):", "",
             "| N x dim | devices | chunk MB | batch | search ms | search q/s | encode ms | est. ceiling q/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        if "error" in res:
            lines.append(f"| {res['n']:,} x {res['dim']} | - | - | - | {res['error']} | | | |")
            continue
        for r in res["rows"]:
            if "error" in r:
                lines.append(f"| {res['n']:,} x {res['dim']} | {', '.join(res['devices'])} | {r['chunk_mb']} | "
                             f"{r['batch']} | {r['error'][:60]} | | | |")
                continue
            lines.append(f"| {res['n']:,} x {res['dim']} | {', '.join(res['devices'])} | {r['chunk_mb']} | "
                         f"{r['batch']} | {r['search_ms']:.1f} | {r['search_qps']:.0f} | {r['encode_ms']:.1f} | "
                         f"{r['est_ceiling_qps']:.0f} |")
    for res in results:
        if res.get("best"):
            b, d = res["best"], res["best_at_first_chunk"]
            lines.append(f"{res['n']:,} x {res['dim']}: est. ceiling {b['est_ceiling_qps']:.0f} q/s at batch "
                         f"{b['batch']}, chunk {b['chunk_mb']} MB" + (f" ({d['est_ceiling_qps']:.0f} q/s with the "
                         f"first chunk budget, {d['chunk_mb']} MB)" if d else ""))
    return lines
