/**
 * The run report: one self-contained HTML file (`report.html` in the run folder) with the curves of
 * metrics.jsonl drawn as inline SVG by a small inline script, the evaluations, the resolved config,
 * and a browsable sample of trajectories (question, every turn's text — code and its output —,
 * answer, reward). Written at the end of `slm-train train`; `slm-train report RUN_DIR` writes it again.
 *
 * Model-written text is hostile input. It only ever reaches the page inside a JSON data block whose
 * `<`, `>`, `&`, U+2028 and U+2029 are \u-escaped (so nothing in it can close the block), and the
 * script puts it on the page with textContent, never as HTML. The page's Content-Security-Policy
 * allows no network at all and runs only the one inline script whose SHA-256 it names, so even
 * markup that slipped through could not run code or fetch anything.
 */
import { createHash } from 'node:crypto';
import { createReadStream, existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { SlmError } from '../errors.js';
import { readRows } from './run.js';

/** A trajectory as the report shows it. */
export interface ReportTrajectory {
  source: string;
  step?: number;
  question: string;
  golds: string[];
  answer: string | null;
  reward: number | null;
  correct?: boolean;
  parts?: Record<string, unknown>;
  turns?: number;
  finish?: string;
  temperature?: number;
  advantage?: number | null;
  messages: Array<{ role: string; content: string }>;
}

export interface ReportData {
  title: string;
  dir: string;
  generated: string;
  metrics: Record<string, unknown>[];
  evals: Record<string, unknown>[];
  trajectories: ReportTrajectory[];
  config: string | null;
}

export interface ReportOptions {
  /** Output file (default: RUN_DIR/report.html). */
  out?: string;
  /** Training steps sampled for trajectories (evenly spaced, first and last included; default 12). */
  steps?: number;
  /** Trajectories per sampled step (best, worst, then others; default 3) and per evaluation (default 12). */
  perStep?: number;
  perEval?: number;
  /** Characters kept per message (default 6000). */
  maxChars?: number;
}

const clip = (s: unknown, n: number): string => {
  const t = typeof s === 'string' ? s : s === undefined || s === null ? '' : JSON.stringify(s);
  return t.length > n ? `${t.slice(0, n)}\n… [${t.length - n} more characters cut]` : t;
};

const num = (x: unknown): number | null => (typeof x === 'number' && Number.isFinite(x) ? x : null);

/** A trajectories.jsonl row (training or evaluation) in the report's shape. */
export function toReportTrajectory(row: Record<string, unknown>, source: string, maxChars: number): ReportTrajectory {
  const q = row.question as unknown;
  const qObj = q && typeof q === 'object' ? (q as Record<string, unknown>) : undefined;
  const golds = (row.golds ?? qObj?.golds ?? []) as unknown;
  const messages = Array.isArray(row.messages) ? (row.messages as Array<Record<string, unknown>>) : [];
  return {
    source,
    step: typeof row.step === 'number' ? row.step : undefined,
    question: clip(qObj ? qObj.question : q, maxChars),
    golds: Array.isArray(golds) ? golds.map((g) => clip(g, 500)) : [clip(golds, 500)],
    answer: row.answer === null || row.answer === undefined ? null : clip(row.answer, maxChars),
    reward: num(row.reward),
    correct: typeof row.correct === 'boolean' ? row.correct : undefined,
    parts: row.parts && typeof row.parts === 'object' ? (row.parts as Record<string, unknown>) : undefined,
    turns: num(row.turns) ?? undefined,
    finish: typeof row.finish === 'string' ? row.finish : undefined,
    temperature: num(row.temperature) ?? undefined,
    advantage: row.advantage === undefined ? undefined : num(row.advantage),
    messages: messages.map((m) => ({ role: clip(m.role, 40), content: clip(m.content, maxChars) })),
  };
}

/**
 * A sample of the training trajectories, read as a stream (the file can be large): per step the
 * best and the worst reward and the first others, then `steps` steps evenly spaced.
 */
async function sampleTraining(file: string, o: Required<Pick<ReportOptions, 'steps' | 'perStep' | 'maxChars'>>): Promise<ReportTrajectory[]> {
  if (!existsSync(file)) return [];
  const bySteps = new Map<number, Array<{ r: number; line: string }>>();
  const rl = createInterface({ input: createReadStream(file, 'utf8'), crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    let row: { step?: unknown; reward?: unknown };
    try {
      row = JSON.parse(line);
    } catch {
      continue;
    }
    const step = typeof row.step === 'number' ? row.step : 0;
    const r = typeof row.reward === 'number' ? row.reward : -Infinity;
    const kept = bySteps.get(step) ?? [];
    kept.push({ r, line });
    if (kept.length > o.perStep) {
      // keep the best, the worst and the earliest others
      const best = kept.reduce((a, b) => (b.r > a.r ? b : a));
      const worst = kept.reduce((a, b) => (b.r < a.r ? b : a));
      const others = kept.filter((x) => x !== best && x !== worst).slice(0, Math.max(0, o.perStep - 2));
      kept.splice(0, kept.length, ...new Set([best, worst, ...others].slice(0, o.perStep)));
    }
    bySteps.set(step, kept);
  }
  const steps = [...bySteps.keys()].sort((a, b) => a - b);
  const pick = steps.length <= o.steps ? steps : [...new Set(Array.from({ length: o.steps }, (_, i) => steps[Math.round((i * (steps.length - 1)) / (o.steps - 1))]))];
  return pick.flatMap((s) =>
    bySteps
      .get(s)!
      .sort((a, b) => b.r - a.r)
      .map((x) => toReportTrajectory(JSON.parse(x.line), `train step ${s}`, o.maxChars)),
  );
}

/** Evaluations under RUN/evals/: their summaries and a sample of their trajectories (correct and wrong). */
function readEvals(dir: string, perEval: number, maxChars: number): { evals: Record<string, unknown>[]; trajectories: ReportTrajectory[] } {
  const root = join(dir, 'evals');
  const evals: Record<string, unknown>[] = [];
  const trajectories: ReportTrajectory[] = [];
  for (const d of existsSync(root) ? readdirSync(root).sort() : []) {
    const f = join(root, d, 'summary.json');
    if (!existsSync(f)) continue;
    try {
      evals.push(JSON.parse(readFileSync(f, 'utf8')));
    } catch {
      continue;
    }
    const rows = readRows(join(root, d, 'trajectories.jsonl'));
    const good = rows.filter((r) => r.correct === true);
    const bad = rows.filter((r) => r.correct !== true);
    const half = Math.ceil(perEval / 2);
    const sample = [...good.slice(0, Math.max(half, perEval - bad.length)), ...bad.slice(0, Math.max(perEval - half, perEval - good.length))].slice(0, perEval);
    trajectories.push(...sample.map((r) => toReportTrajectory(r, `eval ${d}`, maxChars)));
  }
  evals.sort((a, b) => String(a.date ?? '').localeCompare(String(b.date ?? '')));
  return { evals, trajectories };
}

export async function collectReport(dir: string, o: ReportOptions = {}): Promise<ReportData> {
  const abs = resolve(dir);
  if (!existsSync(abs) || !statSync(abs).isDirectory()) throw new SlmError('FILE_NOT_FOUND', `report: ${dir} is not a folder; give a run folder (run.dir/run.name) written by \`slm-train train\`.`);
  const has = ['metrics.jsonl', 'trajectories.jsonl', 'evals'].filter((f) => existsSync(join(abs, f)));
  if (!has.length) throw new SlmError('FILE_NOT_FOUND', `report: ${dir} holds no metrics.jsonl, trajectories.jsonl or evals/; expected a run folder written by \`slm-train train\`.`);
  const maxChars = o.maxChars ?? 6000;
  const ev = readEvals(abs, o.perEval ?? 12, maxChars);
  const cfgFile = join(abs, 'config.yaml');
  return {
    title: basename(abs),
    dir: abs,
    generated: new Date().toISOString(),
    metrics: readRows(join(abs, 'metrics.jsonl')),
    evals: ev.evals,
    trajectories: [...(await sampleTraining(join(abs, 'trajectories.jsonl'), { steps: o.steps ?? 12, perStep: o.perStep ?? 3, maxChars })), ...ev.trajectories],
    config: existsSync(cfgFile) ? readFileSync(cfgFile, 'utf8') : null,
  };
}

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** JSON that is safe inside <script type="application/json">: nothing in it can end the block. */
export function jsonForScript(v: unknown): string {
  return JSON.stringify(v).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

const STYLE = `
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:16px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666;margin:0 0 12px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
#plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:10px}
.plot{border:1px solid #e3e3e3;border-radius:4px;padding:4px}.plot h3{font-size:12px;margin:2px 4px;font-weight:600}
.plot svg{width:100%;height:auto}.plot path.line{fill:none;stroke:#1f6feb;stroke-width:1.5}.plot path.eval{fill:none;stroke:#d9480f;stroke-width:1.5}
.plot .axis{stroke:#999;stroke-width:1}.plot text{font-size:10px;fill:#555}
.traj{border:1px solid #ddd;border-radius:4px;margin:8px 0;padding:6px 10px}.traj h3{font-size:13px;margin:0}
.traj .facts{color:#444;font-size:12px;margin:4px 0}.msg{margin:4px 0}.role{font-weight:600;font-size:12px;color:#555}
.msg pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;margin:2px 0;padding:6px;font-size:12px;max-height:360px;overflow:auto}
.msg.assistant pre{background:#eef5ff}.ok{color:#176f2c}.bad{color:#b42318}pre.config{background:#f7f7f7;padding:8px;overflow:auto}
`;

/** The page's only script: draws the curves and lists the trajectories from the JSON data block. */
const SCRIPT = `(function(){
'use strict';
var data=JSON.parse(document.getElementById('report-data').textContent);
var NS='http://www.w3.org/2000/svg';
function el(tag,attrs,parent,text){var e=document.createElementNS(NS,tag);for(var k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined)e.textContent=text;if(parent)parent.appendChild(e);return e;}
function h(tag,parent,text,cls){var e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;if(parent)parent.appendChild(e);return e;}
function fmt(v){if(v===null||v===undefined)return '-';if(typeof v!=='number')return String(v);var a=Math.abs(v);return a!==0&&(a<1e-3||a>=1e5)?v.toExponential(2):String(+v.toPrecision(4));}
var PREFERRED=['reward_mean','accuracy','answered','loss','pg_loss','vf_loss','kl','entropy','clip_frac','pg_clipfrac','grad_norm','response_tokens_mean','turns_mean','tool_error_rate','tool_errors_mean','mask_coverage','lr'];
var train=data.metrics.filter(function(r){return r.kind!=='eval'&&typeof r.step==='number';});
var evals=data.metrics.filter(function(r){return r.kind==='eval'&&typeof r.step==='number';});
function series(rows,key){return rows.filter(function(r){return typeof r[key]==='number'&&isFinite(r[key]);}).map(function(r){return [r.step,r[key]];});}
var keys={};train.forEach(function(r){for(var k in r)if(k!=='step'&&typeof r[k]==='number')keys[k]=1;});
var ordered=PREFERRED.filter(function(k){return keys[k];}).concat(Object.keys(keys).filter(function(k){return PREFERRED.indexOf(k)<0;}).sort(function(a,b){var ra=a.indexOf('reward/')===0,rb=b.indexOf('reward/')===0;return ra!==rb?(ra?-1:1):a<b?-1:a>b?1:0;}));
var plots=ordered.map(function(k){return {title:k,lines:[{cls:'line',pts:series(train,k)}]};});
var ekeys={};evals.forEach(function(r){for(var k in r)if(k!=='step'&&typeof r[k]==='number')ekeys[k]=1;});
Object.keys(ekeys).sort().forEach(function(k){plots.push({title:'eval: '+k.replace(/^eval_/,''),lines:[{cls:'eval',pts:series(evals,k)}]});});
var grid=document.getElementById('plots'),drawn=0;
plots.forEach(function(p){
  var all=[];p.lines.forEach(function(l){all=all.concat(l.pts);});if(!all.length)return;
  var W=300,H=170,L=44,R=8,T=8,B=22;
  var xs=all.map(function(q){return q[0];}),ys=all.map(function(q){return q[1];});
  var x0=Math.min.apply(null,xs),x1=Math.max.apply(null,xs),y0=Math.min.apply(null,ys),y1=Math.max.apply(null,ys);
  if(x1===x0){x0-=1;x1+=1;}if(y1===y0){var d=Math.abs(y0)*0.1||1;y0-=d;y1+=d;}
  function X(v){return L+(v-x0)/(x1-x0)*(W-L-R);}function Y(v){return H-B-(v-y0)/(y1-y0)*(H-T-B);}
  var box=h('div',grid,undefined,'plot');h('h3',box,p.title);
  var svg=el('svg',{viewBox:'0 0 '+W+' '+H,role:'img','aria-label':p.title},box);
  el('path',{'class':'axis',d:'M'+L+' '+T+'V'+(H-B)+'H'+(W-R)},svg);
  el('text',{x:L-4,y:T+8,'text-anchor':'end'},svg,fmt(y1));el('text',{x:L-4,y:H-B,'text-anchor':'end'},svg,fmt(y0));
  el('text',{x:L,y:H-6},svg,'step '+x0);el('text',{x:W-R,y:H-6,'text-anchor':'end'},svg,String(x1));
  p.lines.forEach(function(l){
    if(!l.pts.length)return;
    var d=l.pts.map(function(q,i){return (i?'L':'M')+X(q[0]).toFixed(1)+' '+Y(q[1]).toFixed(1);}).join('');
    if(l.pts.length===1)d+='h0.01';
    el('path',{'class':l.cls,d:d},svg);
    if(l.pts.length<=60)l.pts.forEach(function(q){var c=el('circle',{cx:X(q[0]).toFixed(1),cy:Y(q[1]).toFixed(1),r:2,fill:l.cls==='eval'?'#d9480f':'#1f6feb'},svg);el('title',{},c,'step '+q[0]+': '+fmt(q[1]));});
  });
  drawn++;
});
if(!drawn)h('p',grid,'No metrics to plot yet.');
document.body.setAttribute('data-plots-drawn',String(drawn));
var list=document.getElementById('traj-list'),sel=document.getElementById('traj-source');
var sources=[];data.trajectories.forEach(function(t){if(sources.indexOf(t.source)<0)sources.push(t.source);});
sources.forEach(function(s){var o=h('option',sel,s);o.value=s;});
function show(){
  list.textContent='';var shown=0;
  data.trajectories.forEach(function(t,i){
    if(sel.value!=='*'&&t.source!==sel.value)return;shown++;
    var box=h('div',list,undefined,'traj');
    h('h3',box,'#'+(i+1)+' '+t.source+': '+t.question);
    var f=h('div',box,undefined,'facts');
    h('span',f,'gold: '+t.golds.join(' | ')+' · answer: '+(t.answer===null?'(none)':t.answer)+' · reward: '+fmt(t.reward));
    if(t.correct!==undefined)h('span',f,t.correct?' · correct':' · wrong',t.correct?'ok':'bad');
    var extra=[];if(t.turns!==undefined)extra.push('turns '+t.turns);if(t.finish)extra.push('finish '+t.finish);if(t.temperature!==undefined)extra.push('temperature '+fmt(t.temperature));if(t.advantage!==undefined)extra.push('advantage '+fmt(t.advantage));
    if(t.parts)for(var k in t.parts)extra.push(k+' '+fmt(t.parts[k]));
    if(extra.length)h('div',box,extra.join(' · '),'facts');
    var det=h('details',box);h('summary',det,t.messages.length+' messages');
    t.messages.forEach(function(m){var d=h('div',det,undefined,'msg '+(m.role==='assistant'?'assistant':'env'));h('div',d,m.role,'role');h('pre',d,m.content);});
  });
  if(!shown)h('p',list,'No trajectories in this run folder.');
  document.body.setAttribute('data-trajectories-shown',String(shown));
}
sel.addEventListener('change',show);show();
})();`;

export function renderReport(d: ReportData): string {
  const hash = createHash('sha256').update(SCRIPT, 'utf8').digest('base64');
  const last = [...d.metrics].reverse().find((r) => r.kind !== 'eval');
  const stage = String(last?.stage ?? d.metrics.find((r) => r.stage)?.stage ?? '');
  const steps = d.metrics.filter((r) => r.kind !== 'eval' && typeof r.step === 'number').length;
  const headline = ['reward_mean', 'accuracy', 'loss', 'kl', 'entropy', 'grad_norm', 'response_tokens_mean', 'turns_mean', 'tool_error_rate', 'mask_coverage'].filter((k) => typeof last?.[k] === 'number');
  const f = (v: unknown) => (typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : escapeHtml(String(v ?? '')));
  const lastTable = headline.length ? `<table><tr><th>last step</th>${headline.map((k) => `<th>${escapeHtml(k)}</th>`).join('')}</tr><tr><td>${f(last?.step)}</td>${headline.map((k) => `<td>${f(last?.[k])}</td>`).join('')}</tr></table>` : '<p>No training steps logged.</p>';
  const pct = (v: unknown) => (typeof v === 'number' ? (100 * v).toFixed(1) : '');
  const evalTable = d.evals.length
    ? `<table><tr><th>evaluation</th><th>n</th><th>accuracy %</th><th>EM %</th><th>F1 %</th><th>ROUGE-L %</th><th>answered %</th><th>avg turns</th><th>reward</th></tr>${d.evals
        .map((e) => `<tr><td>${escapeHtml(String(e.label ?? ''))}</td><td>${f(e.questions)}</td><td>${pct(e.accuracy)}</td><td>${pct(e.em)}</td><td>${pct(e.f1)}</td><td>${pct(e.rouge_l)}</td><td>${pct(e.answered)}</td><td>${f(e.avg_turns)}</td><td>${f(e.reward)}</td></tr>`)
        .join('')}</table>`
    : '<p>No evaluations in this run folder.</p>';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-${hash}'">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>slm-train run ${escapeHtml(d.title)}</title>
<style>${STYLE}</style></head>
<body>
<h1>slm-train run ${escapeHtml(d.title)}</h1>
<p class="meta">${escapeHtml(d.dir)} · ${stage ? `stage ${escapeHtml(stage)} · ` : ''}${steps} steps logged · report written ${escapeHtml(d.generated)}</p>
<noscript><p>The plots and trajectories are drawn by the page's script; the data is in metrics.jsonl and trajectories.jsonl.</p></noscript>
${lastTable}
<h2>Curves</h2>
<div id="plots"></div>
<h2>Evaluations</h2>
${evalTable}
<h2>Trajectories</h2>
<p><label>show <select id="traj-source"><option value="*">all sampled</option></select></label> (a sample: per training step the best and worst episodes, per evaluation correct and wrong ones)</p>
<div id="traj-list"></div>
<h2>Config</h2>
${d.config !== null ? `<details><summary>config.yaml</summary><pre class="config">${escapeHtml(d.config)}</pre></details>` : '<p>No config.yaml in this run folder.</p>'}
<script type="application/json" id="report-data">${jsonForScript({ metrics: d.metrics, trajectories: d.trajectories })}</script>
<script>${SCRIPT}</script>
</body></html>
`;
}

/** Writes the report of run folder `dir`; returns its path. */
export async function writeReport(dir: string, o: ReportOptions = {}): Promise<string> {
  const data = await collectReport(dir, o);
  const out = o.out ?? join(data.dir, 'report.html');
  writeFileSync(out, renderReport(data));
  return out;
}
