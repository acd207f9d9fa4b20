// Progress (lib/util/progress.ts): plain periodic lines when the stream is not a terminal (a fake
// stream and a fake clock), an in-place cli-progress bar when it is (a fake TTY stream), log lines
// above the bar, nested phases, and silence when no stream is given.
import t from 'tap';
import { Progress, progressLog, withProgress } from '../lib/util/progress.js';

function fakeStream(tty: boolean) {
  const writes: string[] = [];
  return { writes, stream: { isTTY: tty, columns: 160, write: (s: string) => (writes.push(s), true) }, text: () => writes.join('') };
}

t.test('line mode: a line per tenth or per interval, counts, rate, ETA and reward, never a redraw', async (t) => {
  const { stream, text, writes } = fakeStream(false);
  let clock = 0;
  const p = new Progress('grpo', 20, 'steps', { stream, now: () => clock, intervalMs: 10_000 });
  t.match(text(), /^\[progress\] grpo: 20 steps\n$/, 'a start line');
  clock = 1000;
  p.update(1, { reward: 0.25 }); // 5 %: no new tenth, 1 s < interval
  t.equal(writes.length, 1, 'no line before a tenth or the interval');
  clock = 4000;
  p.update(2, { reward: 0.5 }); // 10 %
  t.equal(writes.length, 2);
  t.equal(
    writes[1],
    '[progress] grpo: 2/20 steps (10 %), 2.0 s/step, elapsed 4.0 s, ETA 36 s, reward 0.500\n',
    'counts, rate, elapsed, ETA, reward',
  );
  clock = 5000;
  p.set({ detail: 'rollouts 3/16' });
  t.equal(writes.length, 2, 'a detail alone prints nothing');
  clock = 14_500; // 10.5 s after the last line, still in the same tenth
  p.update(3, { accuracy: 0.125 });
  t.equal(writes.length, 3, 'the interval forces a line');
  t.match(writes[2], /^\[progress\] grpo: 3\/20 steps \(15 %\), 4\.8 s\/step, elapsed 15 s, ETA 1m22s, reward 0\.500, acc 12\.5 %\n$/);
  for (let v = 4; v <= 20; v++) {
    clock += 500;
    p.update(v);
  }
  p.stop();
  p.stop(); // idempotent
  const lines = text().trimEnd().split('\n');
  t.ok(lines.length <= 12, `a few lines per phase (${lines.length})`);
  t.match(
    lines.at(-1),
    /^\[progress\] grpo: 20\/20 steps \(100 %\), 1\.2 s\/step, elapsed 23 s, reward 0\.500, acc 12\.5 %, done$/,
    'a final line without ETA',
  );
  // biome-ignore lint/suspicious/noControlCharactersInRegex: ESC (\x1b) starts the terminal escape codes looked for here.
  t.notMatch(text(), /\r|\x1b\[/, 'no carriage returns or escape codes');
  t.match(
    lines
      .slice(1, -1)
      .map((l) => /\((\d+) %\)/.exec(l)![1])
      .join(','),
    /^10,15,20,30,40,50,60,70,80,90$/,
    'one line per new tenth',
  );
});

t.test('line mode: progressLog writes plain lines; a resumed phase counts its rate from where it resumed', async (t) => {
  const { stream, writes } = fakeStream(false);
  let clock = 0;
  const log = progressLog(stream, '[x] ');
  log('before');
  const p = new Progress('sft', 10, 'steps', { stream, now: () => clock }, 6);
  log('during');
  clock = 2000;
  p.update(8);
  p.stop();
  t.same(writes.slice(0, 3), ['[x] before\n', '[progress] sft: resuming at 6/10 steps\n', '[x] during\n']);
  t.match(writes[3], /^\[progress\] sft: 8\/10 steps \(80 %\), 1\.00 steps\/s, elapsed 2\.0 s, ETA 2\.0 s\n$/, '2 steps in 2 s');
});

t.test('TTY mode: the bar is drawn in place and redrawn; log lines go above it; nested bars suspend the outer one', async (t) => {
  const { stream, text, writes } = fakeStream(true);
  let clock = 0;
  const log = progressLog(stream, '[slm-train] ');
  await withProgress('ppo', 4, 'steps', { stream, now: () => clock }, async (p) => {
    t.ok(writes.length >= 1, 'drawn at start');
    t.match(text(), /ppo .*0\/4 steps \(0 %\)/);
    clock = 3000;
    p.update(1, { reward: 0.75, detail: 'train' });
    await new Promise((r) => setTimeout(r, 250)); // the bar's own redraw timer
    t.match(text(), /ppo [█░]+ 1\/4 steps \(25 %\), 3\.0 s\/step, elapsed 3\.0 s, ETA 9\.0 s, reward 0\.750, train/);
    const n = writes.length;
    log('a log line');
    t.ok(writes.slice(n).join('').includes('\r\x1b[2K[slm-train] a log line\n'), 'the log line clears the bar line and is printed above');
    t.match(writes.slice(n + 1).join(''), /ppo [█░]+ 1\/4/, 'then the bar is drawn again');
    await withProgress('eval', 2, 'questions', { stream, now: () => clock }, async (e) => {
      e.update(1, { accuracy: 0.5 });
      await new Promise((r) => setTimeout(r, 250));
      t.match(text(), /eval [█░]+ 1\/2 questions \(50 %\).*acc 50\.0 %/);
      const m = writes.length;
      await new Promise((r) => setTimeout(r, 250));
      t.notMatch(writes.slice(m).join(''), /ppo /, 'the suspended outer bar does not draw');
    });
    p.update(2);
    await new Promise((r) => setTimeout(r, 250));
    t.match(writes.slice(-3).join(''), /ppo [█░]+ 2\/4/, 'the outer bar resumes after the inner one');
  });
  const redraws = text()
    // biome-ignore lint/suspicious/noControlCharactersInRegex: ESC (\x1b) starts the terminal escape codes looked for here.
    .split(/\x1b\[\d*G|\r/)
    .filter((s) => /ppo [█░]+/.test(s)).length;
  t.ok(redraws >= 3, `the bar is redrawn in place (${redraws} draws), not printed as lines`);
  t.notMatch(text(), /\[progress\]/, 'no plain progress lines on a terminal');
  t.ok(text().endsWith('\n'), 'the last state stays on its own line');
});

t.test('no stream: silent', async (t) => {
  const p = new Progress('x', 3, 'steps', undefined);
  p.update(2, { reward: 1 });
  p.stop();
  t.equal(p.value, 2);
  t.match(p.status(), /^2\/3 steps \(66 %\)/);
});
