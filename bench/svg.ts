/**
 * Hand-written SVG charts (no dependency): grouped bars with optional
 * whiskers, on a linear or log10 axis. Several panels stack vertically in
 * one file.
 */

export interface Series {
  name: string;
  /** One value per category; null = not measured. */
  values: (number | null)[];
  /** Optional whisker top per category (e.g. p99 over a p50 bar). */
  high?: (number | null)[];
}

export interface BarPanel {
  title: string;
  yLabel: string;
  categories: string[];
  series: Series[];
  log?: boolean;
}

const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

function niceMax(v: number): number {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function fmtTick(v: number): string {
  if (v >= 1000) return `${+(v / 1000).toFixed(1)}k`;
  if (v >= 10) return String(Math.round(v));
  return String(+v.toFixed(2));
}

function panel(p: BarPanel, width: number, top: number): { svg: string; height: number } {
  const height = 300;
  const m = { l: 70, r: 20, t: 30, b: 70 };
  const legendW = 190;
  const plotW = width - m.l - m.r - legendW;
  const plotH = height - m.t - m.b;
  const all = p.series.flatMap((s) => [...s.values, ...(s.high ?? [])]).filter((v): v is number => v !== null && v > 0);
  const maxV = all.length ? Math.max(...all) : 1;
  const minV = all.length ? Math.min(...all) : 1;
  let y: (v: number) => number;
  const ticks: number[] = [];
  if (p.log) {
    const lo = Math.floor(Math.log10(minV));
    const hi = Math.ceil(Math.log10(maxV)) === lo ? lo + 1 : Math.ceil(Math.log10(maxV));
    y = (v) => m.t + plotH - ((Math.log10(Math.max(v, 10 ** lo)) - lo) / (hi - lo)) * plotH;
    for (let e = lo; e <= hi; e++) ticks.push(10 ** e);
  } else {
    const top = niceMax(maxV);
    y = (v) => m.t + plotH - (v / top) * plotH;
    for (let i = 0; i <= 5; i++) ticks.push((top * i) / 5);
  }
  const out: string[] = [`<g transform="translate(0,${top})">`];
  out.push(`<text x="${m.l}" y="18" font-size="14" font-weight="bold">${esc(p.title)}</text>`);
  for (const t of ticks) {
    const ty = y(t).toFixed(1);
    out.push(`<line x1="${m.l}" x2="${m.l + plotW}" y1="${ty}" y2="${ty}" stroke="#ddd"/>`);
    out.push(`<text x="${m.l - 6}" y="${ty}" font-size="10" text-anchor="end" dominant-baseline="middle">${fmtTick(t)}</text>`);
  }
  out.push(
    `<text transform="translate(14,${m.t + plotH / 2}) rotate(-90)" font-size="11" text-anchor="middle">${esc(p.yLabel)}${p.log ? " (log)" : ""}</text>`,
  );
  const n = Math.max(1, p.categories.length);
  const groupW = plotW / n;
  const barW = Math.max(2, Math.min(28, (groupW * 0.8) / Math.max(1, p.series.length)));
  p.categories.forEach((c, ci) => {
    const gx = m.l + ci * groupW + (groupW - barW * p.series.length) / 2;
    p.series.forEach((s, si) => {
      const v = s.values[ci];
      const x = gx + si * barW;
      if (v === null || v === undefined || !(v > 0)) return;
      const by = y(v);
      out.push(
        `<rect x="${x.toFixed(1)}" y="${by.toFixed(1)}" width="${(barW - 1).toFixed(1)}" height="${(m.t + plotH - by).toFixed(1)}" fill="${COLORS[si % COLORS.length]}"><title>${esc(`${s.name} · ${c}: ${fmtTick(v)}`)}</title></rect>`,
      );
      const h = s.high?.[ci];
      if (h !== null && h !== undefined && h > v) {
        const cx = (x + (barW - 1) / 2).toFixed(1);
        out.push(`<line x1="${cx}" x2="${cx}" y1="${by.toFixed(1)}" y2="${y(h).toFixed(1)}" stroke="#333"/>`);
        out.push(`<line x1="${(x + 1).toFixed(1)}" x2="${(x + barW - 2).toFixed(1)}" y1="${y(h).toFixed(1)}" y2="${y(h).toFixed(1)}" stroke="#333"/>`);
      }
    });
    const lx = m.l + ci * groupW + groupW / 2;
    out.push(
      `<text transform="translate(${lx.toFixed(1)},${m.t + plotH + 12}) rotate(30)" font-size="10">${esc(c)}</text>`,
    );
  });
  out.push(`<line x1="${m.l}" x2="${m.l + plotW}" y1="${m.t + plotH}" y2="${m.t + plotH}" stroke="#333"/>`);
  p.series.forEach((s, si) => {
    const ly = m.t + 4 + si * 16;
    const lx = m.l + plotW + 14;
    out.push(`<rect x="${lx}" y="${ly}" width="10" height="10" fill="${COLORS[si % COLORS.length]}"/>`);
    out.push(`<text x="${lx + 14}" y="${ly + 9}" font-size="11">${esc(s.name)}</text>`);
  });
  out.push("</g>");
  return { svg: out.join("\n"), height };
}

export function barChart(panels: BarPanel[], title: string, note?: string): string {
  const width = 900;
  const parts: string[] = [];
  let top = 40;
  for (const p of panels) {
    const r = panel(p, width, top);
    parts.push(r.svg);
    top += r.height + 10;
  }
  const height = top + (note ? 20 : 0);
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="20" y="24" font-size="16" font-weight="bold">${esc(title)}</text>`,
    ...parts,
    note ? `<text x="20" y="${height - 8}" font-size="10" fill="#555">${esc(note)}</text>` : "",
    "</svg>",
    "",
  ].join("\n");
}
