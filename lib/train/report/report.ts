/**
 * The run report: one self-contained HTML file (`report.html` in the run folder) with the curves of
 * metrics.jsonl drawn by uPlot (inlined from node_modules, so the file opens offline), grouped
 * (reward and accuracy, losses, KL/entropy/clipping, lengths and turns, timing, other), evaluation
 * rows as points on their training curve, an EMA smoothing slider; the evaluations, the resolved config,
 * and a browsable sample of trajectories (question, every turn's text — code and its output —,
 * answer, reward). Written at the end of `slm-train train`; `slm-train report RUN_DIR` writes it again.
 * This file renders and writes the page; report-data.ts reads the run folder, report-browser.ts
 * holds the page's stylesheet and script.
 *
 * Model-written text is hostile input. It only ever reaches the page inside a JSON data block whose
 * `<`, `>`, `&`, U+2028 and U+2029 are \u-escaped (so nothing in it can close the block), and the
 * script puts it on the page with textContent, never as HTML. The page's Content-Security-Policy
 * allows no network at all and runs only the two inline scripts (uPlot, the page's) whose SHA-256 it names, so even
 * markup that slipped through could not run code or fetch anything.
 */
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createRequire } from 'node:module';
import { SlmError } from '../../errors.js';
import { collectReport, type ReportData, type ReportOptions } from './report-data.js';
import { SCRIPT, STYLE } from './report-browser.js';

export { collectReport, type ReportData, type ReportOptions, type ReportTrajectory } from './report-data.js';
export { reportHelpers } from './report-browser.js';

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** JSON that is safe inside <script type="application/json">: nothing in it can end the block. */
export function jsonForScript(v: unknown): string {
  return JSON.stringify(v).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

const require = createRequire(import.meta.url);
let uplotCache: { js: string; css: string } | undefined;
/** uPlot (MIT, github.com/leeoniya/uPlot), read from node_modules and inlined so the report opens offline. */
function uplotAssets(): { js: string; css: string } {
  if (uplotCache) return uplotCache;
  let dir = '',
    version = '',
    js = '',
    css = '';
  try {
    dir = dirname(require.resolve('uplot/package.json'));
    version = (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version: string }).version;
    // The banner's URL goes (the page names no address); the licence notice stays.
    js = readFileSync(join(dir, 'dist', 'uPlot.iife.min.js'), 'utf8').replace(/^\/\*![^*]*\*\/\s*/, '');
    css = readFileSync(join(dir, 'dist', 'uPlot.min.css'), 'utf8');
  } catch (e) {
    throw new SlmError(
      'FILE_NOT_FOUND',
      `report: the plotting library uPlot could not be read (${(e as Error).message.split('\n')[0]}). Expected the "uplot" package beside slm-train; reinstall it (npm install).`,
    );
  }
  if (/<\/script|<!--|<\/style/i.test(js + css))
    throw new SlmError('FILE_NOT_FOUND', `report: ${dir}/dist holds markup that could end its inline block; reinstall uplot.`);
  uplotCache = { js: `/*! uPlot v${version} | (c) Leon Sorokin | MIT License | github.com/leeoniya/uPlot */\n${js}`, css };
  return uplotCache;
}

function renderReport(reportData: ReportData): string {
  const uplot = uplotAssets();
  const hashes = [uplot.js, SCRIPT].map((x) => `'sha256-${createHash('sha256').update(x, 'utf8').digest('base64')}'`).join(' ');
  const last = [...reportData.metrics].reverse().find((r) => r.kind !== 'eval');
  const stage = String(last?.stage ?? reportData.metrics.find((r) => r.stage)?.stage ?? '');
  const steps = reportData.metrics.filter((r) => r.kind !== 'eval' && typeof r.step === 'number').length;
  const headline = [
    'reward_mean',
    'accuracy',
    'loss',
    'kl',
    'entropy',
    'grad_norm',
    'response_tokens_mean',
    'turns_mean',
    'tool_error_rate',
    'mask_coverage',
  ].filter((k) => typeof last?.[k] === 'number');
  const f = (v: unknown) =>
    typeof v === 'number'
      ? Number.isInteger(v)
        ? String(v)
        : Math.abs(v) < 1e-12
          ? '0'
          : String(+v.toPrecision(4))
      : escapeHtml(String(v ?? ''));
  const lastTable = headline.length
    ? `<table><tr><th>last step</th>${headline.map((k) => `<th>${escapeHtml(k)}</th>`).join('')}</tr><tr><td>${f(last?.step)}</td>${headline.map((k) => `<td>${f(last?.[k])}</td>`).join('')}</tr></table>`
    : '<p>No training steps logged.</p>';
  const pct = (v: unknown) => (typeof v === 'number' ? (100 * v).toFixed(1) : '');
  const evalTable = reportData.evals.length
    ? `<table><tr><th>evaluation</th><th>n</th><th>accuracy %</th><th>EM %</th><th>F1 %</th><th>ROUGE-L %</th><th>answered %</th><th>avg turns</th><th>reward</th></tr>${reportData.evals
        .map(
          (e) =>
            `<tr><td>${escapeHtml(String(e.label ?? ''))}</td><td>${f(e.questions)}</td><td>${pct(e.accuracy)}</td><td>${pct(e.em)}</td><td>${pct(e.f1)}</td><td>${pct(e.rouge_l)}</td><td>${pct(e.answered)}</td><td>${f(e.avg_turns)}</td><td>${f(e.reward)}</td></tr>`,
        )
        .join('')}</table>`
    : '<p>No evaluations in this run folder.</p>';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src ${hashes}">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>slm-train run ${escapeHtml(reportData.title)}</title>
<style>${uplot.css}
${STYLE}</style></head>
<body>
<h1>slm-train run ${escapeHtml(reportData.title)}</h1>
<p class="meta">${escapeHtml(reportData.dir)} · ${stage ? `stage ${escapeHtml(stage)} · ` : ''}${steps} steps logged · report written ${escapeHtml(reportData.generated)}</p>
<noscript><p>The plots and trajectories are drawn by the page's script; the data is in metrics.jsonl and trajectories.jsonl.</p></noscript>
<nav><a href="#curves">curves</a><a href="#evaluations">evaluations</a><a href="#trajectories">trajectories</a><a href="#config">config</a></nav>
${lastTable}
<h2 id="curves">Curves</h2>
<div class="controls"><label>smoothing (EMA) <input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0"> <span id="smoothing-value">off</span></label><span><span class="key"></span> evaluation (on the matching training curve)</span><span>hover a plot for the values at a step</span></div>
<div id="plots"></div>
<h2 id="evaluations">Evaluations</h2>
${evalTable}
<h2 id="trajectories">Trajectories</h2>
<p><label>show <select id="traj-source"><option value="*">all sampled</option></select></label> (a sample: per training step the best and worst episodes, per evaluation correct and wrong ones)</p>
<div id="traj-list"></div>
<h2 id="config">Config</h2>
${reportData.config !== null ? `<details><summary>config.yaml</summary><pre class="config">${escapeHtml(reportData.config)}</pre></details>` : '<p>No config.yaml in this run folder.</p>'}
<script type="application/json" id="report-data">${jsonForScript({ metrics: reportData.metrics, trajectories: reportData.trajectories })}</script>
<script>${uplot.js}</script>
<script>${SCRIPT}</script>
</body></html>
`;
}

/** Writes the report of run folder `dir`; returns its path. */
export async function writeReport(dir: string, opts: ReportOptions = {}): Promise<string> {
  const data = await collectReport(dir, opts);
  const out = opts.out ?? join(data.dir, 'report.html');
  writeFileSync(out, renderReport(data));
  return out;
}
