"""Prints bench/results.jsonl (runs of `mirror-bench --brokers kafka`) as Markdown: one table
per backlog, then the benchmark's goals with the ratios measured in this run."""
import json
import sys

NAMES = {"consume-only": "consume-only", "produce-only": "produce-only", "mirror": "this mirror",
         "mirror-batches": "this mirror, batches",
         "mm1": "MirrorMaker 1", "mm1-tuned": "MirrorMaker 1, tuned", "mm2": "MirrorMaker 2",
         "batched-loop": "batched loop (Rust)"}


def rate(r):
    return r["records"] / r["steady_secs"]


def cpu_per_million(r, jit=False, window="steady_cpu"):
    """Steady-phase CPU seconds per million records (start-up excluded) when measured; without
    `jit`, the JVM's JIT compiler threads are left out (a long-running JVM has compiled its hot
    code); the limits measure the whole process. `window="second_half_cpu"`: the second half of
    the backlog only (the warmed-up figure), where measured."""
    s = r.get(window) or r.get("steady_cpu")
    if s and s["records"] > 0 and s["cpu_secs"] > 0:
        cpu = s["cpu_secs"] if jit else s["cpu_secs"] - s.get("jit_secs", 0)
        return cpu / s["records"] * 1e6
    return r["cpu_secs"] / r["records"] * 1e6


def warm(r, jit=False):
    """CPU seconds per million records over the second half of the backlog."""
    return cpu_per_million(r, jit, window="second_half_cpu")


def mb_per_cpu(r, per_million=cpu_per_million):
    return (r["bytes"] / r["records"]) / per_million(r)


def plural(n):
    return "s" if n > 1 else ""


def fmt(x, digits=0):
    return f"{x:,.{digits}f}"


def backlog(run):
    return (f"{run['records']:,} × {run['value_bytes']} B, {run['partitions']} partitions,"
            f" source batches {run['compression']}")


def table(run):
    print(f"\n{backlog(run)}:\n")
    print("| contender | streams | records/s | MB/s | total s | first record s |"
          " CPU s per M records: steady, JIT excluded (with JIT; whole process) |"
          " second half, JIT excluded (with JIT) | MB per CPU s |"
          " peak RSS MiB | latency p50 / p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in run["results"]:
        lat = ""
        if r.get("latency_p50_ms") is not None:
            lat = f"{r['latency_p50_ms']:.0f} / {r['latency_p99_ms']:.0f}"
        streams = r["streams"] if r["contender"] in ("mirror", "mirror-batches", "mm1", "mm2",
                                                   "mm1-tuned") else ""
        print(f"| {NAMES[r['contender']]} | {streams} | {fmt(rate(r))} |"
              f" {fmt(r['bytes'] / r['steady_secs'] / 1e6, 1)} | {fmt(r['total_secs'], 1)} |"
              f" {fmt(r['first_record_secs'], 1)} |"
              f" {fmt(cpu_per_million(r), 2)} ({fmt(cpu_per_million(r, jit=True), 2)};"
              f" {fmt(r['cpu_secs'] / r['records'] * 1e6, 2)}) |"
              f" {fmt(warm(r), 2)} ({fmt(warm(r, jit=True), 2)}) |"
              f" {fmt(mb_per_cpu(r), 0)} | {r['peak_rss_kib'] // 1024} | {lat} |")


def find(run, contender, streams=None):
    for r in run["results"]:
        if r["contender"] == contender and (streams is None or r["streams"] == streams):
            return r
    return None


def goals(runs):
    print("\nGoals (ratios within this run):\n")
    print("| goal | backlog | measured | met |")
    print("|---|---|---|---|")
    for run in runs:
        b = f"{run['value_bytes']} B {run['compression']}"
        streams = sorted({r["streams"] for r in run["results"] if r["contender"] == "mirror"})
        rows = {"cpu": [], "rss": [], "rate": []}
        for s in streams:
            m = find(run, "mirror", s)
            for peer in ("mm1", "mm2"):
                p = find(run, peer, s)
                if not (m and p):
                    continue
                tag = f"{'MM1' if peer == 'mm1' else 'MM2'} {s}"
                rows["cpu"].append((cpu_per_million(p) / cpu_per_million(m), tag))
                rows["rss"].append((m["peak_rss_kib"] / p["peak_rss_kib"], tag))
                rows["rate"].append((rate(m) / rate(p), tag))
        if rows["cpu"]:
            worst = min(rows["cpu"])
            print(f"| records per CPU s ≥ 3× MM1 and MM2 (equal streams) | {b} |"
                  f" {', '.join(f'{x:.1f}× {t}' for x, t in rows['cpu'])} |"
                  f" {'yes' if worst[0] >= 3 else 'no'} |")
            worst = max(rows["rss"])
            print(f"| peak RSS ≤ 1/4 of either JVM | {b} |"
                  f" {', '.join(f'{x:.2f} of {t}' for x, t in rows['rss'])} |"
                  f" {'yes' if worst[0] <= 0.25 else 'no'} |")
            worst = min(rows["rate"])
            print(f"| steady records/s ≥ each (equal streams) | {b} |"
                  f" {', '.join(f'{x:.2f}× {t}' for x, t in rows['rate'])} |"
                  f" {'yes' if worst[0] >= 1 else 'no'} |")
        m1, c = find(run, "mirror", 1), find(run, "consume-only")
        if m1 and c:
            x = rate(m1) / rate(c)
            print(f"| 1 stream ≥ 0.8 of consume-only | {b} | {x:.2f} | {'yes' if x >= 0.8 else 'no'} |")
        mm2 = find(run, "mm2", 1)
        if m1 and mm2:
            x = m1["first_record_secs"] / mm2["first_record_secs"]
            print(f"| start to first record ≤ 1/3 of MM2's (1 stream / 1 task) | {b} |"
                  f" {m1['first_record_secs']:.1f} s / {mm2['first_record_secs']:.1f} s = {x:.2f} |"
                  f" {'yes' if x <= 1 / 3 else 'no'} |")
        for s in streams:
            m, bt = find(run, "mirror", s), find(run, "mirror-batches", s)
            if not (m and bt):
                continue
            x = cpu_per_million(m) / cpu_per_million(bt)
            print(f"| batches: records per CPU s vs records ({s} stream{plural(s)}) | {b} |"
                  f" {x:.2f}× | {'yes' if x > 1 else 'no'} |")
        if run["value_bytes"] >= 1024 and streams:
            mb_per_cpu_row(run, "mirror", streams, 340, max)


def yes(ok):
    return "yes" if ok else "no"


def mb_per_cpu_row(run, contender, streams, goal, over):
    """The goal row "1 KiB: ≥ goal MB per CPU s" of `contender` at each stream count; met when
    `over` (max: the best stream count; min: every one) reaches the goal."""
    b = f"{run['value_bytes']} B {run['compression']}"
    xs = [(mb_per_cpu(find(run, contender, s)), s) for s in streams]
    print(f"| 1 KiB: ≥ {goal} MB per CPU s | {b} |"
          f" {', '.join(f'{x:.0f} ({s} stream{plural(s)})' for x, s in xs)} |"
          f" {yes(over(xs)[0] >= goal)} |")


def batch_goals(runs):
    """The batch engine's goals (issue 22). The CPU ones compare the peers' warmed-up figure
    (the second half of the backlog, JIT threads left out) with the batch engine's steady one:
    the engine's second half is a few clock ticks of /proc's 10 ms, too few to count on, and
    its steady window holds its own start, so it never flatters it."""
    print("\nGoals of the batch engine (ratios within this run; the peers' CPU over the second"
          " half of the backlog, JIT threads excluded; the batch engine's over its steady"
          " phase):\n")
    print("| goal | backlog | measured | met |")
    print("|---|---|---|---|")
    for run in runs:
        b = f"{run['value_bytes']} B {run['compression']}"
        streams = sorted({r["streams"] for r in run["results"]
                          if r["contender"] == "mirror-batches"})
        if not streams:
            continue
        for peer, tag, goal in (("mm1", "MM1", 5), ("mm2", "MM2", 15)):
            xs = [(warm(find(run, peer, s)) / cpu_per_million(find(run, "mirror-batches", s)), s)
                  for s in streams if find(run, peer, s)]
            if xs:
                print(f"| records per CPU s ≥ {goal}× {tag} (equal streams) | {b} |"
                      f" {', '.join(f'{x:.1f}× {tag} {s}' for x, s in xs)} |"
                      f" {yes(min(xs)[0] >= goal)} |")
        if run["value_bytes"] >= 1024:
            goal = 1000 if run["compression"] == "lz4" else 600
            mb_per_cpu_row(run, "mirror-batches", streams, goal, min)
        b1, c = find(run, "mirror-batches", 1), find(run, "consume-only")
        if b1 and c:
            x = rate(b1) / rate(c)
            print(f"| 1 stream ≥ 0.8 of consume-only | {b} | {x:.2f} | {yes(x >= 0.8)} |")
        b4 = find(run, "mirror-batches", 4)
        if b4:
            mib = b4["peak_rss_kib"] / 1024
            print(f"| peak RSS ≤ 64 MiB with 4 streams | {b} | {mib:.0f} MiB | {yes(mib <= 64)} |")
        for s in streams:
            bt, p = find(run, "mirror-batches", s), find(run, "mm1", s)
            if bt and p and bt.get("latency_p50_ms") is not None \
                    and p.get("latency_p50_ms") is not None:
                ok = bt["latency_p50_ms"] <= p["latency_p50_ms"] \
                    and bt["latency_p99_ms"] <= p["latency_p99_ms"]
                print(f"| latency p50 and p99 ≤ MM1's ({s} stream{plural(s)}) | {b} |"
                      f" {bt['latency_p50_ms']:.0f} / {bt['latency_p99_ms']:.0f} ms vs"
                      f" {p['latency_p50_ms']:.0f} / {p['latency_p99_ms']:.0f} ms | {yes(ok)} |")
        m4 = find(run, "mirror", 4)
        if m4:
            mib = m4["peak_rss_kib"] / 1024
            print(f"| records engine: peak RSS < 160 MiB with 4 streams | {b} | {mib:.0f} MiB |"
                  f" {yes(mib < 160)} |")


runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
runs = [r for r in runs if r.get("brokers") == "kafka"]
for run in runs:
    table(run)
goals(runs)
batch_goals(runs)
