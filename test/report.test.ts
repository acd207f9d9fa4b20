// The HTML run report (lib/train/report.ts, `slm-train report RUN_DIR`): built from a run folder
// whose trajectories hold hostile model text, checked as text (escaping, one pinned script, no
// network) and in a real headless Chromium: the page opens, the plots draw, the trajectories are
// listed, no console errors, and nothing the "model" wrote ran.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import t from 'tap';
import { RunFolder } from '../lib/train/run.js';
import { collectReport, jsonForScript, writeReport } from '../lib/train/report.js';
import { findChromium, openPage } from './helpers/browser.js';
import { runCli } from './helpers/cli.js';
import { needs } from './helpers/shared.js';

const HOSTILE_Q = 'Who </script><script>window.__pwned="question"</script> wrote it?';
const HOSTILE_A = '<img src=x onerror="window.__pwned=\'answer\'">';
const HOSTILE_M = '<python>\nprint("</script><svg onload=window.__pwned=1>")\n</python> \u2028 <!-- <script>';

function makeRun(dir: string): void {
  const run = new RunFolder(dir);
  for (let step = 1; step <= 6; step++) {
    run.logMetrics({ stage: 'grpo', step, lr: 1e-4, reward_mean: 0.1 * step, 'reward/f1': 0.05 * step, accuracy: step / 12, loss: 1 / step, kl: 0.01 * step, entropy: 2 - 0.1 * step, clip_frac: 0.02, grad_norm: 0.5, response_tokens_mean: 40 + step, turns_mean: 1.5, tool_error_rate: 0.25, mask_coverage: 0.3, time_rollout_s: 2, time_train_s: 1 });
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
  run.logMetrics({ step: 6, kind: 'eval', eval_accuracy: 0.5, eval_f1: 0.6 });
  run.close();
  const ev = join(dir, 'evals', 'grpo@step-6');
  mkdirSync(ev, { recursive: true });
  writeFileSync(join(ev, 'summary.json'), JSON.stringify({ label: '<b>grpo</b>@step-6', questions: 2, accuracy: 0.5, em: 0.5, f1: 0.6, rouge_l: 0.6, answered: 1, avg_turns: 2, reward: 0.6, date: '2026-01-01T00:00:00Z' }));
  writeFileSync(
    join(ev, 'trajectories.jsonl'),
    [
      { id: 'e1', question: 'Eval question one?', golds: ['Ada'], answer: 'Ada', correct: true, reward: 1, turns: 2, finish: 'answer', messages: [{ role: 'user', content: 'Eval question one?' }, { role: 'assistant', content: '<answer>Ada</answer>' }] },
      { id: 'e2', question: 'Eval </script> two?', golds: ['Bob'], answer: HOSTILE_A, correct: false, reward: 0, turns: 1, finish: 'answer', messages: [{ role: 'assistant', content: HOSTILE_M }] },
    ]
      .map((r) => JSON.stringify(r))
      .join('\n') + '\n',
  );
  writeFileSync(join(dir, 'config.yaml'), 'stage: grpo\nsystem_prompt: "</pre><script>window.__pwned=\'config\'</script>"\n');
}

t.test('the report as text: every model-written string escaped, one hash-pinned script, no network', async (t) => {
  const dir = t.testdir();
  makeRun(dir);
  const out = await writeReport(dir);
  t.equal(out, join(dir, 'report.html'));
  const html = readFileSync(out, 'utf8');
  t.equal((html.match(/<script/g) ?? []).length, 2, 'the data block and the page script, nothing else');
  t.notMatch(html, /<img|<svg onload|window\.__pwned="question"<\/script>|<\/pre><script>|<b>grpo/i, 'no hostile markup survives as markup');
  t.match(html, /&lt;b&gt;grpo&lt;\/b&gt;@step-6/, 'evaluation labels escaped in the table');
  t.match(html, /Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-[A-Za-z0-9+/=]+'"/);
  t.notMatch(html.replace("'http://www.w3.org/2000/svg'", ''), /https?:\/\//, 'no URL to fetch anything from (the SVG namespace aside)');
  const data = JSON.parse(/<script type="application\/json" id="report-data">([\s\S]*?)<\/script>/.exec(html)![1]);
  t.equal(data.metrics.length, 7, 'every metrics row');
  const sample = data.trajectories as Array<{ source: string; question: string; answer: string | null; messages: unknown[] }>;
  t.ok(sample.some((x) => x.question === HOSTILE_Q && x.source === 'train step 1'), 'the hostile question is in the data, intact');
  t.ok(sample.some((x) => x.answer === HOSTILE_A));
  t.same([...new Set(sample.map((x) => x.source))], ['train step 1', 'train step 2', 'train step 3', 'train step 4', 'train step 5', 'train step 6', 'eval grpo@step-6']);
  t.equal(sample.filter((x) => x.source === 'train step 3').length, 3, 'three per step (best, worst, one other)');
  t.same(jsonForScript({ a: '</script>\u2028&' }), '{"a":"\\u003c/script\\u003e\\u2028\\u0026"}');
  const fewer = await collectReport(dir, { steps: 2, perStep: 2 });
  t.same([...new Set(fewer.trajectories.map((x) => x.source))], ['train step 1', 'train step 6', 'eval grpo@step-6'], 'first and last step when sampling 2');
  const s6 = fewer.trajectories.filter((x) => x.source === 'train step 6');
  t.same(s6.map((x) => x.reward), [1, 0], 'per step: the best and the worst reward');
});

t.test('slm-train report RUN_DIR writes the report; a folder that is not a run is an error', async (t) => {
  const dir = t.testdir();
  makeRun(dir);
  const r = runCli(['report', dir, '--json']);
  t.equal(r.code, 0, r.stderr);
  t.same(JSON.parse(r.stdout), { report: join(dir, 'report.html') });
  t.ok(existsSync(join(dir, 'report.html')));
  const other = join(dir, 'other.html');
  t.equal(runCli(['report', dir, '--out', other]).code, 0);
  t.ok(existsSync(other));
  const empty = join(dir, 'checkpoints'); // a folder with no metrics, trajectories or evals/
  const bad = runCli(['report', empty]);
  t.equal(bad.code, 2);
  t.match(bad.stderr, /error FILE_NOT_FOUND: report: .* holds no metrics\.jsonl, trajectories\.jsonl or evals\//);
});

const chromium = findChromium();
const noChromium = needs(chromium ? false : 'chromium is not installed (apt-get install chromium)', t);
t.test('in headless Chromium: the page opens, the plots draw, trajectories are listed, no console errors, no hostile script ran', { skip: noChromium }, async (t) => {
  const dir = t.testdir();
  makeRun(dir);
  const file = await writeReport(dir);
  const check = `(() => {
    const paths = [...document.querySelectorAll('#plots svg path.line, #plots svg path.eval')];
    const boxes = [...document.querySelectorAll('.traj')];
    return {
      plotsDrawn: document.body.getAttribute('data-plots-drawn'),
      titles: [...document.querySelectorAll('#plots h3')].map((h) => h.textContent),
      paths: paths.length,
      nonEmptyPaths: paths.filter((p) => /^M[\\d.]+ [\\d.]+((L[\\d.]+ [\\d.]+)+|h0\\.01)$/.test(p.getAttribute('d'))).length,
      trajectories: boxes.length,
      shown: document.body.getAttribute('data-trajectories-shown'),
      pwned: window.__pwned === undefined ? null : String(window.__pwned),
      imgs: document.querySelectorAll('img, iframe, object, embed').length,
      scripts: document.scripts.length,
      hostileShownAsText: boxes.some((b) => b.textContent.includes('window.__pwned="question"')),
      answerAsText: document.body.textContent.includes(${JSON.stringify(HOSTILE_A)}),
      evalLabel: document.querySelector('table:nth-of-type(2) td')?.textContent ?? null,
    };
  })()`;
  const r = await openPage(chromium!, pathToFileURL(file).href, check);
  const v = r.value as Record<string, unknown>;
  t.same(r.errors, [], 'no console errors, exceptions or CSP violations');
  t.equal(v.pwned, null, 'no hostile script ran');
  t.equal(v.imgs, 0, 'no hostile element was created');
  t.equal(v.scripts, 2);
  const titles = v.titles as string[];
  t.ok(Number(v.plotsDrawn) >= 14, `plots drawn: ${v.plotsDrawn}`);
  t.equal(titles.length, Number(v.plotsDrawn));
  t.same(titles.slice(0, 3), ['reward_mean', 'accuracy', 'loss'], 'headline curves first');
  t.ok(titles.includes('eval: accuracy') && titles.includes('reward/f1') && titles.includes('tool_error_rate'));
  t.equal(v.nonEmptyPaths, v.paths, 'every curve has a path through its points');
  t.ok((v.paths as number) >= 14);
  t.equal(v.trajectories, 6 * 3 + 2, 'the sampled trajectories are listed');
  t.equal(v.shown, '20');
  t.equal(v.hostileShownAsText, true, 'the hostile question is shown as text');
  t.equal(v.answerAsText, true, 'the hostile answer is shown as text');
  t.equal(v.evalLabel, '<b>grpo</b>@step-6', 'labels shown as text');
});
