#!/usr/bin/env python3
"""Line charts as SVG from a CSV file, with nothing but the standard library.

    python3 scripts/plot.py DATA.csv OUT.svg --x COLUMN --y COL[,COL...]
        [--title TEXT] [--xlabel TEXT] [--ylabel TEXT] [--logx] [--logy] [--y2 COL[,COL...]]

The CSV has a header row; every named column holds numbers (empty cells are skipped).
Each --y column is one line on the left axis; --y2 columns go on a right axis of their own
(for two quantities of different units on one chart). The benchmarks and the soak write
their figures as CSV next to BENCHMARKS.md and call this to draw them.
"""
import argparse
import csv
import math
import sys

W, H = 760, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 80, 48, 64
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]


def esc(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def nice_ticks(lo, hi, n=5):
    """About n round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def log_ticks(lo, hi):
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0 ** e for e in range(a, b + 1)]


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


class Axis:
    def __init__(self, values, log, lo_px, hi_px, zero=True):
        vals = [v for v in values if not log or v > 0]
        if not vals:
            vals = [1.0]
        lo, hi = min(vals), max(vals)
        self.log = log
        if log:
            self.ticks = log_ticks(lo, hi)
            self.lo, self.hi = math.log10(self.ticks[0]), math.log10(self.ticks[-1])
            if self.hi == self.lo:
                self.hi += 1
        else:
            if zero:
                lo = min(lo, 0.0)
            self.ticks = nice_ticks(lo, hi)
            self.lo, self.hi = self.ticks[0], self.ticks[-1]
            if self.hi == self.lo:
                self.hi += 1
        self.lo_px, self.hi_px = lo_px, hi_px

    def px(self, v):
        if self.log:
            v = math.log10(max(v, 1e-300))
        return self.lo_px + (v - self.lo) / (self.hi - self.lo) * (self.hi_px - self.lo_px)


def read(path, x, ys):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot.py: {path} has no data rows")
    for c in [x] + ys:
        if c not in rows[0]:
            sys.exit(f"plot.py: {path} has no column {c!r} (columns: {', '.join(rows[0])})")
    series = {}
    for c in ys:
        pts = []
        for r in rows:
            try:
                pts.append((float(r[x]), float(r[c])))
            except (TypeError, ValueError):
                continue
        series[c] = pts
    return series


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--x", required=True)
    p.add_argument("--y", required=True)
    p.add_argument("--y2", default="")
    p.add_argument("--title", default="")
    p.add_argument("--xlabel", default=None)
    p.add_argument("--ylabel", default="")
    p.add_argument("--y2label", default="")
    p.add_argument("--logx", action="store_true")
    p.add_argument("--logy", action="store_true")
    a = p.parse_args()
    ys = [c for c in a.y.split(",") if c]
    y2s = [c for c in a.y2.split(",") if c]
    series = read(a.data, a.x, ys + y2s)
    xs = [pt[0] for c in series for pt in series[c]]
    xa = Axis(xs, a.logx, LEFT, W - RIGHT, zero=False)
    ya = Axis([pt[1] for c in ys for pt in series[c]], a.logy, H - BOTTOM, TOP)
    y2a = Axis([pt[1] for c in y2s for pt in series[c]], a.logy, H - BOTTOM, TOP) if y2s else None

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    if a.title:
        out.append(f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="15">{esc(a.title)}</text>')
    for t in xa.ticks:
        x = xa.px(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{fmt(t)}</text>')
    for t in ya.ticks:
        y = ya.px(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    if y2a:
        for t in y2a.ticks:
            out.append(f'<text x="{W - RIGHT + 6}" y="{y2a.px(t) + 4:.1f}">{fmt(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
               'fill="none" stroke="#444"/>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 24}" text-anchor="middle">'
               f'{esc(a.xlabel if a.xlabel is not None else a.x)}</text>')
    if a.ylabel:
        out.append(f'<text transform="translate(18,{(TOP + H - BOTTOM) / 2}) rotate(-90)" '
                   f'text-anchor="middle">{esc(a.ylabel)}</text>')
    if a.y2label:
        out.append(f'<text transform="translate({W - 14},{(TOP + H - BOTTOM) / 2}) rotate(90)" '
                   f'text-anchor="middle">{esc(a.y2label)}</text>')
    legend_y = H - 8
    legend_x = LEFT
    for i, c in enumerate(ys + y2s):
        axis = ya if c in ys else y2a
        color = COLORS[i % len(COLORS)]
        dash = "" if c in ys else ' stroke-dasharray="6,3"'
        pts = sorted(series[c])
        if pts:
            path = " ".join(f"{xa.px(x):.1f},{axis.px(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            for x, y in pts:
                out.append(f'<circle cx="{xa.px(x):.1f}" cy="{axis.px(y):.1f}" r="3" fill="{color}"/>')
        label = c + ("" if c in ys else " (right)")
        out.append(f'<line x1="{legend_x}" y1="{legend_y - 4}" x2="{legend_x + 18}" y2="{legend_y - 4}" '
                   f'stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{legend_x + 22}" y="{legend_y}">{esc(label)}</text>')
        legend_x += 30 + 7 * len(label)
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
