"""Draws bench/results.jsonl (one line per benchmark run) as bar charts.

Runs of `mirror-bench --brokers kafka` get three rows (steady records/s, MB per CPU second in
the steady phase, peak RSS), one column per backlog; runs on mock clusters get one row of
records/s.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"consume-only": "#999999", "produce-only": "#999999", "mirror": "#1f77b4",
          "mirror-batches": "#17becf",
          "mm1": "#ff7f0e", "mm1-tuned": "#ffbb78", "mm2": "#2ca02c", "batched-loop": "#d62728"}
NAMES = {"consume-only": "consume\nonly", "produce-only": "produce\nonly", "mirror": "mirror",
         "mirror-batches": "mirror\nbatches",
         "mm1": "MM1", "mm1-tuned": "MM1\ntuned", "mm2": "MM2", "batched-loop": "batched\nloop"}


def label(r):
    name = NAMES[r["contender"]]
    if r["contender"] in ("mirror", "mirror-batches", "mm1", "mm2"):
        name += f"\n{r['streams']}"
    return name


def steady_mb_per_cpu(r):
    """Steady phase, the JVM's JIT compiler threads left out (as bench/table.py)."""
    s = r.get("steady_cpu")
    if s and s["records"] > 0 and s["cpu_secs"] > 0:
        cpu = s["cpu_secs"] - s.get("jit_secs", 0)
        return s["records"] * (r["bytes"] / r["records"]) / 1e6 / cpu
    return r["bytes"] / 1e6 / r["cpu_secs"]


def kafka_figure(runs, target):
    fig, axes = plt.subplots(3, len(runs), figsize=(6.5 * len(runs), 10), squeeze=False)
    for col, run in enumerate(runs):
        results = run["results"]
        labels = [label(r) for r in results]
        colors = [COLORS[r["contender"]] for r in results]
        x = range(len(results))
        rows = [
            ([r["records"] / r["steady_secs"] / 1000 for r in results], "thousand records/s (steady)"),
            ([steady_mb_per_cpu(r) for r in results], "MB per CPU second (steady, no JIT)"),
            ([r["peak_rss_kib"] / 1024 for r in results], "peak RSS, MiB"),
        ]
        for row, (values, ylabel) in enumerate(rows):
            ax = axes[row][col]
            ax.bar(x, values, color=colors)
            ax.set_xticks(list(x), labels, fontsize=7)
            ax.set_ylabel(ylabel)
            if row == 2:
                ax.set_yscale("log")
        axes[0][col].set_title(
            f"{run['records']:,} records of {run['value_bytes']} B, {run['partitions']} partitions,"
            f" source batches {run['compression']}", fontsize=9)
    fig.suptitle(f"mirror-maker vs MirrorMaker 1 and 2 (Kafka {runs[0]['kafka']}), one broker per"
                 " cluster on loopback,\na 2-core machine shared (one run; numbers under bars:"
                 " streams or tasks)", fontsize=10)
    fig.tight_layout()
    fig.savefig(target, dpi=100)


def mock_figure(runs, target):
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.5), squeeze=False)
    for ax, run in zip(axes[0], runs):
        labels, rates = [], []
        for r in run["results"]:
            name = {"ConsumeOnly": "consume\nonly", "ProduceOnly": "produce\nonly",
                    "Mirror": f"mirror\n{r['streams']} stream(s)", "MirrorStrict": "mirror\nKIP-3 strict",
                    "Peer": "hand-written\nloop"}[r["kind"]]
            labels.append(name)
            rates.append(r["records"] / r["steady_secs"] / 1000)
        colors = ["#999999" if l.startswith(("consume", "produce")) else "#d62728" if l.startswith("hand") else "#1f77b4" for l in labels]
        ax.bar(range(len(rates)), rates, color=colors)
        ax.set_xticks(range(len(rates)), labels, fontsize=7)
        ax.set_ylabel("thousand records/s (steady)")
        ax.set_title(f"{run['records']:,} records of {run['value_bytes']} B, {run['partitions']} partitions", fontsize=9)
    fig.suptitle("mirror-maker on a 2-core machine, mock clusters on loopback (one run)")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


source, target = sys.argv[1], sys.argv[2]
runs = [json.loads(line) for line in open(source) if line.strip()]
kafka = [r for r in runs if r.get("brokers") == "kafka"]
if kafka:
    kafka_figure(kafka, target)
else:
    mock_figure(runs, target)
print(f"wrote {target}")
