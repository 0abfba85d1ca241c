"""OpenMP's wait policy when torch processes share the cores: two processes side by side, each
training a MiniLM-sized transformer layer (width 384, 12 heads, 16 x 48 tokens) with torch's
default threads (all cores), against the same alone; OpenMP's default (threads that wait spin)
against OMP_WAIT_POLICY=PASSIVE (they sleep). Each case a fresh process, alternated, ROUNDS
times; the figure is each case's median wall for STEPS steps.

Why it matters here: the test tiers run one test per core, so a stage that uses every core
(evaluate, predict, a fused search group) shares them with another worker's process;
tests/conftest.py sets PASSIVE for every process a test starts.

usage: python benchmarks/omp_wait.py   -> benchmarks/results/omp_wait.json
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import harness

STEPS, ROUNDS = 30, 3
WORK = f"""
import time, torch
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(384, 12, 1536, batch_first=True)
x = torch.randn(16, 48, 384)
opt = torch.optim.AdamW(layer.parameters())
t0 = time.perf_counter()
for _ in range({STEPS}):
    layer(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
print(time.perf_counter() - t0)
"""


def walls(policy: str | None, side_by_side: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    procs = [subprocess.Popen([sys.executable, "-c", WORK], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(side_by_side)]
    return [float(p.communicate()[0]) for p in procs]


def main() -> None:
    started, load = time.time(), os.getloadavg()
    cases = {(policy, n): [] for n in (1, 2) for policy in ("default", "PASSIVE")}
    for _ in range(ROUNDS):
        for policy, n in cases:
            cases[(policy, n)] += walls(None if policy == "default" else policy, n)
    median = {f"{'alone' if n == 1 else 'two side by side'}, {policy}": round(
        statistics.median(v), 2) for (policy, n), v in cases.items()}
    figures = {
        "side_by_side_default_over_passive": round(
            statistics.median(cases[("default", 2)]) / statistics.median(cases[("PASSIVE", 2)]), 2),
        "alone_passive_over_default": round(
            statistics.median(cases[("PASSIVE", 1)]) / statistics.median(cases[("default", 1)]), 2)}
    harness.write_result("omp_wait", {
        "machine": harness.machine(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                   time.gmtime()),
        "steps": STEPS, "rounds": ROUNDS, "median_wall_s": median, "figures": figures,
        "walls_s": {f"{policy} x{n}": v for (policy, n), v in cases.items()},
        "loadavg_at_start": load, "wall_s": round(time.time() - started, 1)})
    print(median, figures)


if __name__ == "__main__":
    main()
