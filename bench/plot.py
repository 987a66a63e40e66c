"""Draws bench/results.jsonl (one line per benchmark run) as a bar chart of records/s."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

source, target = sys.argv[1], sys.argv[2]
runs = [json.loads(line) for line in open(source) if line.strip()]
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
print(f"wrote {target}")
