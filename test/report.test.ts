// The HTML run report (lib/train/report/report.ts, `slm-train report RUN_DIR`): built from a run folder
// whose trajectories hold hostile model text, checked as text (escaping, two pinned scripts: uPlot
// inlined and the page's, no network), its plotting plan (groups, evaluation points on their
// training curve, EMA, number format) in a VM, and in a real headless Chromium: the page opens, the
// plots draw, and a screenshot shows each plot area mostly background with a line of its series'
// colour (and the evaluation points' colour where there are some), no dark fill; the trajectories
// are listed, no console errors, and nothing the "model" wrote ran.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t, { type Test } from 'tap';
import { RunFolder } from '../lib/train/run.js';
import { collectReport, jsonForScript, reportHelpers, writeReport } from '../lib/train/report/report.js';
import { findChromium, withPage } from './helpers/browser.js';
import { decodePng, encodePng, regionStats } from './helpers/png.js';
import { runCli } from './helpers/cli.js';
import { needs } from './helpers/shared.js';

const HOSTILE_Q = 'Who </script><script>window.__pwned="question"</script> wrote it?';
const HOSTILE_A = '<img src=x onerror="window.__pwned=\'answer\'">';
const HOSTILE_M = '<python>\nprint("</script><svg onload=window.__pwned=1>")\n</python> \u2028 <!-- <script>';

function makeRun(dir: string): void {
  const run = new RunFolder(dir);
  for (let step = 1; step <= 6; step++) {
    run.logMetrics({
      stage: 'grpo',
      step,
      lr: 1e-4,
      reward_mean: 0.1 * step,
      'reward/f1': 0.05 * step,
      accuracy: step / 12,
      loss: 1 / step,
      kl: 0.01 * step,
      entropy: 2 - 0.1 * step,
      clip_frac: 0.02,
      advantages_mean: step === 3 ? 0.1 * 3 - 0.3 : 0.05 * (step - 3),
      grad_norm: 0.5,
      response_tokens_mean: 40 + step,
      response_tokens_min: 30 + step,
      response_tokens_max: 60 + 2 * step,
      turns_mean: 1.5,
      tool_error_rate: 0.25,
      mask_coverage: 0.3,
      time_rollout_s: 2,
      time_train_s: 1,
    });
    const rows = [0, 1, 2, 3].map((j) => ({
      step,
      question: { id: `q${j}`, index: j, question: j === 0 ? HOSTILE_Q : `Question ${step}.${j}?`, golds: ['Ada'] },
      temperature: 1,
      answer: j === 1 ? HOSTILE_A : j === 3 ? null : 'Ada',
      reward: j === 2 ? 1 : 0.1 * j,
      parts: { f1: 0.5 },
      advantage: j - 1.5,
      turns: 2,
      finish: 'answer',
      messages: [
        { role: 'system', content: 'You search.' },
        { role: 'user', content: j === 0 ? HOSTILE_Q : 'Question?' },
        { role: 'assistant', content: j === 0 ? HOSTILE_M : '<python>\nprint(search_pages("x"))\n</python>' },
        { role: 'user', content: '<python_output>\n[{"page_id": "p1"}]\n</python_output>' },
        { role: 'assistant', content: `<answer>${j === 1 ? HOSTILE_A : 'Ada'}</answer>` },
      ],
    }));
    writeFileSync(join(dir, 'trajectories.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n', { flag: 'a' });
  }
  run.logMetrics({ step: 3, kind: 'eval', eval_accuracy: 0.4, eval_f1: 0.45 });
  run.logMetrics({ step: 6, kind: 'eval', eval_accuracy: 0.5, eval_f1: 0.6 });
  run.close();
  const ev = join(dir, 'evals', 'grpo@step-6');
  mkdirSync(ev, { recursive: true });
  writeFileSync(
    join(ev, 'summary.json'),
    JSON.stringify({
      label: '<b>grpo</b>@step-6',
      questions: 2,
      accuracy: 0.5,
      em: 0.5,
      f1: 0.6,
      rouge_l: 0.6,
      answered: 1,
      avg_turns: 2,
      reward: 0.6,
      date: '2026-01-01T00:00:00Z',
    }),
  );
  writeFileSync(
    join(ev, 'trajectories.jsonl'),
    [
      {
        id: 'e1',
        question: 'Eval question one?',
        golds: ['Ada'],
        answer: 'Ada',
        correct: true,
        reward: 1,
        turns: 2,
        finish: 'answer',
        messages: [
          { role: 'user', content: 'Eval question one?' },
          { role: 'assistant', content: '<answer>Ada</answer>' },
        ],
      },
      {
        id: 'e2',
        question: 'Eval </script> two?',
        golds: ['Bob'],
        answer: HOSTILE_A,
        correct: false,
        reward: 0,
        turns: 1,
        finish: 'answer',
        messages: [{ role: 'assistant', content: HOSTILE_M }],
      },
    ]
      .map((r) => JSON.stringify(r))
      .join('\n') + '\n',
  );
  writeFileSync(join(dir, 'config.yaml'), 'stage: grpo\nsystem_prompt: "</pre><script>window.__pwned=\'config\'</script>"\n');
}

t.test(
  'the report as text: every model-written string escaped, two hash-pinned scripts (uPlot inlined, the page), no network',
  async (t) => {
    const dir = t.testdir();
    makeRun(dir);
    const out = await writeReport(dir);
    t.equal(out, join(dir, 'report.html'));
    const html = readFileSync(out, 'utf8');
    t.equal((html.match(/<script/g) ?? []).length, 3, 'the data block, uPlot and the page script, nothing else');
    t.notMatch(
      html,
      /<img|<svg onload|window\.__pwned="question"<\/script>|<\/pre><script>|<b>grpo/i,
      'no hostile markup survives as markup',
    );
    t.match(html, /&lt;b&gt;grpo&lt;\/b&gt;@step-6/, 'evaluation labels escaped in the table');
    const csp =
      /Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src ((?:'sha256-[A-Za-z0-9+/=]+' ?)+)"/.exec(
        html,
      );
    t.ok(csp, 'a CSP that allows no network and names its scripts');
    const inline = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
    t.equal(inline.length, 2);
    t.same(
      csp![1].trim().split(' '),
      inline.map((s) => `'sha256-${createHash('sha256').update(s, 'utf8').digest('base64')}'`),
      'the CSP pins exactly the two inline scripts',
    );
    t.match(inline[0], /^\/\*! uPlot v1\.\d+\.\d+ \| \(c\) Leon Sorokin \| MIT License/, 'uPlot is inlined, with its licence notice');
    t.match(html, /\.u-legend \{/, "uPlot's stylesheet is inlined");
    t.notMatch(html, /https?:\/\//, 'no URL to fetch anything from');
    const data = JSON.parse(/<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/.exec(html)![1]);
    t.equal(data.metrics.length, 8, 'every metrics row');
    const sample = data.trajectories as Array<{ source: string; question: string; answer: string | null; messages: unknown[] }>;
    t.ok(
      sample.some((x) => x.question === HOSTILE_Q && x.source === 'train step 1'),
      'the hostile question is in the data, intact',
    );
    t.ok(sample.some((x) => x.answer === HOSTILE_A));
    t.same(
      [...new Set(sample.map((x) => x.source))],
      ['train step 1', 'train step 2', 'train step 3', 'train step 4', 'train step 5', 'train step 6', 'eval grpo@step-6'],
    );
    t.equal(sample.filter((x) => x.source === 'train step 3').length, 3, 'three per step (best, worst, one other)');
    t.same(jsonForScript({ a: '</script>\u2028&' }), '{"a":"\\u003c/script\\u003e\\u2028\\u0026"}');
    const fewer = await collectReport(dir, { steps: 2, perStep: 2 });
    t.same(
      [...new Set(fewer.trajectories.map((x) => x.source))],
      ['train step 1', 'train step 6', 'eval grpo@step-6'],
      'first and last step when sampling 2',
    );
    const s6 = fewer.trajectories.filter((x) => x.source === 'train step 6');
    t.same(
      s6.map((x) => x.reward),
      [1, 0],
      'per step: the best and the worst reward',
    );
  },
);

t.test(
  "the page's plotting plan (the same text the page runs): groups, evaluation points on their training curve, EMA, number format",
  async (t) => {
    const dir = t.testdir();
    makeRun(dir);
    const h = reportHelpers();
    const metrics = (await collectReport(dir)).metrics;
    type Plan = {
      id: string;
      title: string;
      group: string;
      x: number[];
      series: Array<{ key: string; label: string; eval: boolean; dash: boolean; values: Array<number | null> }>;
    };
    const plan = JSON.parse(JSON.stringify(h.planPlots(metrics))) as Plan[];
    const byGroup: Record<string, string[]> = {};
    for (const p of plan) (byGroup[p.group] ??= []).push(p.title);
    t.same(byGroup, {
      reward: ['reward_mean', 'accuracy', 'advantages_mean', 'reward/f1'],
      loss: ['loss'],
      kl: ['kl', 'entropy', 'clip_frac'],
      length: ['response_tokens (mean, min, max)', 'turns_mean', 'tool_error_rate', 'mask_coverage'],
      timing: ['time per phase (s)'],
      other: ['grad_norm', 'lr'],
    });
    t.same(
      JSON.parse(JSON.stringify(h.GROUPS)).map((g: { title: string }) => g.title),
      ['Reward and accuracy', 'Losses', 'KL, entropy, clipping', 'Lengths and turns', 'Timing', 'Other'],
    );
    const acc = plan.find((p) => p.id === 'accuracy')!;
    t.same(acc.x, [1, 2, 3, 4, 5, 6]);
    t.same(
      acc.series.map((s) => [s.label, s.eval]),
      [
        ['accuracy', false],
        ['eval accuracy', true],
      ],
      'eval_accuracy drawn on the accuracy plot',
    );
    t.same(acc.series[1].values, [null, null, 0.4, null, null, 0.5], 'evaluation points at their steps only');
    t.same(
      plan.find((p) => p.id === 'reward/f1')!.series.map((s) => s.key),
      ['reward/f1', 'eval_f1'],
      'eval_f1 on the reward/f1 plot',
    );
    const len = plan.find((p) => p.id === 'response_tokens')!;
    t.same(
      len.series.map((s) => [s.label, s.dash]),
      [
        ['mean', false],
        ['min', true],
        ['max', true],
      ],
    );
    t.same(
      plan.find((p) => p.id === 'time')!.series.map((s) => s.label),
      ['rollout', 'train'],
    );
    t.notOk(
      plan.some((p) => p.id.startsWith('eval_')),
      'no separate plot for an evaluation metric that has a training curve',
    );
    // an evaluation metric without a training curve gets its own plot; a step logged twice (a resumed run) keeps its last row
    const own = JSON.parse(
      JSON.stringify(
        h.planPlots([
          { step: 1, loss: 2 },
          { step: 2, loss: 1 },
          { step: 2, loss: 0.5 },
          { step: 2, kind: 'eval', eval_rouge_l: 0.3, eval_time_s: 4 },
        ]),
      ),
    ) as Plan[];
    t.same(
      own.map((p) => [p.title, p.group]),
      [
        ['loss', 'loss'],
        ['eval_rouge_l', 'reward'],
        ['eval_time_s', 'timing'],
      ],
    );
    t.same(own[0].series[0].values, [2, 0.5]);
    // PPO's and SFT's names
    t.same(
      [
        'vf_loss',
        'sft_loss',
        'pg_clipfrac',
        'kl_coef',
        'ratio_mean',
        'entropy',
        'tokens_per_s',
        'tokens_trained',
        'sequence_tokens_mean',
        'tool_errors_mean',
        'explained_var',
        'grad_norm',
      ].map((k) => h.groupOf(k)),
      ['loss', 'loss', 'kl', 'kl', 'kl', 'kl', 'timing', 'length', 'length', 'length', 'reward', 'other'],
    );
    // EMA with TensorBoard's debiasing: the first value is kept, gaps stay gaps; 0 is no smoothing
    t.same(JSON.parse(JSON.stringify(h.ema([1, null, 2, 3], 0.5))), [1, null, 5 / 3, 17 / 7]);
    t.same(JSON.parse(JSON.stringify(h.ema([1, 2], 0))), [1, 2]);
    // ticks: the decimals their spacing needs; float noise is 0
    t.same(
      [
        [-5.55e-17, 0.05],
        [0.30000000000000004, 0.1],
        [2.5, 2.5],
        [0.25, 0.25],
        [7500, 2500],
        [12000, 2000],
        [2e6, 5e5],
        [1.5e-4, 5e-5],
        [5e-5, 5e-5],
      ].map(([v, i]) => h.fmtNum(v, i)),
      ['0', '0.3', '2.5', '0.25', '7500', '12k', '2.0M', '1.5e-4', '5e-5'],
    );
    t.same(
      [-5.55e-17, 0.000123, 1234.5678, 0.5, null].map((v) => h.fmtNum(v)),
      ['0', '1.23e-4', '1235', '0.5', '-'],
    );
  },
);

t.test('the PNG decoder reads every row filter', async (t) => {
  const width = 7;
  const height = 10;
  const data = new Uint8Array(width * height * 4).map((_, i) => (i * 37 + (i >> 3) * 11) & 255);
  for (const filters of [[0], [1], [2], [3], [4], [0, 1, 2, 3, 4]])
    t.same(decodePng(encodePng({ width, height, data }, filters)).data, data, `filters ${filters}`);
});

t.test('slm-train report RUN_DIR writes the report; a folder that is not a run is an error', async (t) => {
  const dir = t.testdir();
  makeRun(dir);
  const r = runCli(['report', dir, '--json']);
  t.equal(r.code, 0, r.stderr);
  t.same(JSON.parse(r.stdout), { report: join(dir, 'report.html') });
  t.ok(existsSync(join(dir, 'report.html')));
  t.match(readFileSync(join(dir, 'report.html'), 'utf8'), /uPlot v1\.\d+/, 'with uPlot inlined from the installed package');
  const other = join(dir, 'other.html');
  t.equal(runCli(['report', dir, '--out', other]).code, 0);
  t.ok(existsSync(other));
  const empty = join(dir, 'checkpoints'); // a folder with no metrics, trajectories or evals/
  const bad = runCli(['report', empty]);
  t.equal(bad.code, 2);
  t.match(bad.stderr, /error FILE_NOT_FOUND: report: .* holds no metrics\.jsonl, trajectories\.jsonl or evals\//);
});

const rgb = (hex: string): [number, number, number] => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)) as [number, number, number];
/** Over white: the colour `hex` drawn at `alpha`. */
const faint = (hex: string, alpha: number): [number, number, number] =>
  rgb(hex).map((c) => Math.round(alpha * c + (1 - alpha) * 255)) as [number, number, number];

type PlotBox = {
  title: string;
  color: string;
  evalColor: string | null;
  legend: string[];
  x: number;
  y: number;
  width: number;
  height: number;
};
const PLOT_BOXES = `[...document.querySelectorAll('#plots .plot')].map((p) => {
  const r = p.querySelector('.u-over').getBoundingClientRect();
  return { title: p.getAttribute('data-title'), color: p.getAttribute('data-color'), evalColor: p.getAttribute('data-eval-color'),
    legend: [...p.querySelectorAll('.u-legend .u-label')].map((l) => l.textContent),
    x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height };
})`;

/** What a person sees in each plot area of the screenshot. */
function checkPlots(t: Test, png: Buffer, boxes: PlotBox[], o: { faintAlpha?: number } = {}): void {
  const img = decodePng(png);
  for (const b of boxes) {
    const colours: Record<string, [number, number, number]> = { series: rgb(b.color) };
    if (b.evalColor) colours.eval = rgb(b.evalColor);
    if (o.faintAlpha) colours.faint = faint(b.color, o.faintAlpha);
    const s = regionStats(img, b, colours, 40);
    const what = `${b.title}: ${JSON.stringify(s)} in ${Math.round(b.width)}x${Math.round(b.height)}`;
    t.ok(b.width > 200 && b.height > 100, `plot area of a readable size: ${what}`);
    t.ok(s.background / s.pixels > 0.8, `mostly background: ${what}`);
    t.ok(s.dark / s.pixels < 0.01, `no dark fill: ${what}`);
    t.ok(s.near.series > b.width * 0.8, `a line of the series' colour across it: ${what}`);
    if (b.evalColor) t.ok(s.near.eval >= 40, `evaluation points in their colour: ${what}`);
    if (o.faintAlpha) t.ok(s.near.faint > b.width * 1.2, `the raw series drawn faint under the smoothed one: ${what}`);
  }
}

const chromium = findChromium();
const noChromium = needs(chromium ? false : 'chromium is not installed (apt-get install chromium)', t);
t.test(
  'in headless Chromium: grouped plots drawn as a person sees them (screenshot), smoothing, trajectories listed, no console errors, no hostile script ran',
  { skip: noChromium },
  async (t) => {
    const dir = t.testdir();
    makeRun(dir);
    const file = await writeReport(dir);
    const check = `(() => {
    const boxes = [...document.querySelectorAll('.traj')];
    return {
      plotsDrawn: document.body.getAttribute('data-plots-drawn'),
      groups: [...document.querySelectorAll('#plots section.group')].map((s) => [s.querySelector('h3').textContent, [...s.querySelectorAll('.plot')].map((p) => p.getAttribute('data-title'))]),
      canvases: document.querySelectorAll('#plots .plot canvas').length,
      svgs: document.querySelectorAll('#plots svg').length,
      trajectories: boxes.length,
      shown: document.body.getAttribute('data-trajectories-shown'),
      pwned: window.__pwned === undefined ? null : String(window.__pwned),
      imgs: document.querySelectorAll('img, iframe, object, embed').length,
      scripts: document.scripts.length,
      hostileShownAsText: boxes.some((b) => b.textContent.includes('window.__pwned="question"')),
      answerAsText: document.body.textContent.includes(${JSON.stringify(HOSTILE_A)}),
      firstRoles: [...boxes[0].querySelectorAll('.msg .role')].map((r) => r.textContent),
      firstOpen: boxes[0].querySelector('details').open,
      firstHead: boxes[0].querySelector('.head').textContent,
      evalLabel: document.querySelector('table:nth-of-type(2) td')?.textContent ?? null,
    };
  })()`;
    await withPage(chromium!, pathToFileURL(file).href, async (page) => {
      const v = (await page.evaluate(check)) as Record<string, unknown>;
      t.equal(v.pwned, null, 'no hostile script ran');
      t.equal(v.imgs, 0, 'no hostile element was created');
      t.equal(v.scripts, 3);
      t.same(v.groups, [
        ['Reward and accuracy', ['reward_mean', 'accuracy', 'advantages_mean', 'reward/f1']],
        ['Losses', ['loss']],
        ['KL, entropy, clipping', ['kl', 'entropy', 'clip_frac']],
        ['Lengths and turns', ['response_tokens (mean, min, max)', 'turns_mean', 'tool_error_rate', 'mask_coverage']],
        ['Timing', ['time per phase (s)']],
        ['Other', ['grad_norm', 'lr']],
      ]);
      t.equal(v.plotsDrawn, '15');
      t.equal(v.canvases, 15, 'every plot drawn by uPlot on a canvas');
      t.equal(v.svgs, 0, 'no hand-written SVG');
      t.equal(v.trajectories, 6 * 3 + 2, 'the sampled trajectories are listed');
      t.equal(v.shown, '20');
      t.equal(v.hostileShownAsText, true, 'the hostile question is shown as text');
      t.equal(v.answerAsText, true, 'the hostile answer is shown as text');
      t.same(v.firstRoles, ['system', 'user', 'assistant', 'user', 'assistant'], 'each message under its role');
      t.equal(v.firstOpen, true, 'the first conversation is open');
      t.match(v.firstHead as string, /^#1 train step 1\s*reward 1\s*turns 2/, 'source and reward first');
      t.equal(v.evalLabel, '<b>grpo</b>@step-6', 'labels shown as text');

      await page.fitToContent();
      const boxes = (await page.evaluate(PLOT_BOXES)) as PlotBox[];
      t.equal(boxes.length, 15);
      t.same(boxes.find((b) => b.title === 'accuracy')!.legend, ['step', 'accuracy', 'eval accuracy']);
      t.same(
        boxes.filter((b) => b.evalColor).map((b) => b.title),
        ['accuracy', 'reward/f1'],
        'evaluation points on their training plots',
      );
      checkPlots(t, await page.screenshot(), boxes);

      // smoothing: the smoothed curve in the series' colour over the raw one, drawn faint
      await page.evaluate(
        `(() => { const s = document.getElementById('smoothing'); s.value = '0.8'; s.dispatchEvent(new Event('input')); })()`,
      );
      t.equal(
        await page.evaluate(`document.body.getAttribute('data-smoothing') + ' ' + document.getElementById('smoothing-value').textContent`),
        '0.8 0.80',
      );
      await page.fitToContent();
      const smoothed = (await page.evaluate(PLOT_BOXES)) as PlotBox[];
      t.same(smoothed.find((b) => b.title === 'loss')!.legend, ['step', 'loss (raw)', 'loss']);
      checkPlots(
        t,
        await page.screenshot(),
        smoothed.filter((b) => b.title === 'loss' || b.title === 'kl'),
        { faintAlpha: 0x4d / 255 },
      );
      t.same(page.errors, [], 'no console errors, exceptions or CSP violations');
    });
    // a long run opens smoothed
    const long = join(dir, 'long');
    const run = new RunFolder(long);
    for (let step = 1; step <= 60; step++) run.logMetrics({ stage: 'sft', step, loss: 2 / step + (step % 2) * 0.3 });
    run.close();
    await withPage(chromium!, pathToFileURL(await writeReport(long)).href, async (page) => {
      t.same(
        await page.evaluate(
          `[document.body.getAttribute('data-smoothing'), [...document.querySelectorAll('.u-legend .u-label')].map((l) => l.textContent)]`,
        ),
        ['0.6', ['step', 'loss (raw)', 'loss']],
      );
      t.same(page.errors, []);
    });
  },
);
