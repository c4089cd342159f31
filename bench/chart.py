#!/usr/bin/env python3
"""Draw bench/results.png from results.json (called by bench/run; needs matplotlib).

One horizontal bar group per figure: each filesystem's speed relative to bindfs
(x times better than bindfs, log scale; > 1 is better than bindfs).
Usage: chart.py results.json results.png"""
import json, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

res = json.load(open(sys.argv[1]))
med, kinds = res["median"], res["kinds"]
ref = "bindfs" if "bindfs" in med else ("tmpfs" if "tmpfs" in med else None)
if ref is None:
    sys.exit("no reference filesystem (bindfs or tmpfs) in the results")
fss = [n for n in res["filesystems"] if n in med and n != ref]
figs = [f for f in kinds if f in med[ref] and f != "rss"]
fig, ax = plt.subplots(figsize=(11, 0.55 * len(figs) * max(1, len(fss)) / 2 + 2))
h = 0.8 / max(1, len(fss))
colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
for k, name in enumerate(fss):
    ys, xs = [], []
    for i, f in enumerate(figs):
        v, r = med[name].get(f), med[ref].get(f)
        if not v or not r:
            continue
        ys.append(i + k * h)
        xs.append(v / r if kinds[f] == "rate" else r / v)
    ax.barh(ys, xs, height=h, label=res["filesystems"][name]["label"], color=colors[k % len(colors)])
ax.set_xscale("log")
ax.axvline(1, color="black", lw=0.8)
ax.set_yticks([i + h * (len(fss) - 1) / 2 for i in range(len(figs))])
ax.set_yticklabels(figs)
ax.invert_yaxis()
ax.set_xlabel("times better than %s (log scale; > 1 = better)" % ref)
ax.set_title("esfs benchmark %s, N=%d, %s" % (res["date"], res["n"], res["machine"][:60]), fontsize=9)
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=90)
