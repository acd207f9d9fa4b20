// The embedded demo at its full, default size (what `npx slm-train` runs, seed 0) against the README's
// table: the baseline, SFT and GRPO cells of seed 0 (accuracy on the 150 held-out questions, in their
// demonstrated and undemonstrated phrasings) are read from the README and must be what this code
// draws, each group recomputed here from the evaluation trajectories. Whether RL gains over SFT is a
// draw (the README: +0.0, +2.8 and +20.8 points in seeds 0, 1 and 2 since 422b104, +13.3, +12.5 and
// +10.4 before it, when the training head on AVX2 ran ATen's operations); this test asserts no
// winner, only that the README's row is this code's, and that SFT is above the untrained model. About
// 3-9 minutes on 2 cores.
//
// The kernels are pinned to those the README's figures were measured with (AVX2: the addon's
// kernels, ATen's and OpenBLAS's Zen ones, which run on any x86 CPU with AVX2 + FMA), so a CPU with
// AVX-512 runs the same arithmetic: another rounding changes which episodes are sampled, and a run
// of this size is as different from the measured one as another seed is. The variables are read
// when the libraries load, so they are set before the first import that loads the addon.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';

Object.assign(process.env, { SLM_TRAIN_CPU_ISA: 'avx2', ATEN_CPU_CAPABILITY: 'avx2', OPENBLAS_CORETYPE: 'ZEN' });
const { runDemo } = await import('../lib/demo/pipeline.js');

t.test("npx slm-train (seed 0) draws the README table's seed-0 row", async (t) => {
  const out = join(t.testdir(), 'demo');
  const r = await runDemo({ out, seed: 0 });
  const { addon } = await import('../lib/binding/index.js');
  t.equal(addon().version().cpuIsa, 'avx2', 'the kernels the README measured: AVX2');
  const by = Object.fromEntries(r.stages.map((s) => [s.stage, s.scores]));
  t.same(Object.keys(by), ['baseline', 'sft', 'grpo']);
  t.ok(
    r.stages.every((s) => s.summary.questions === 150),
    'every stage on the 150 held-out questions',
  );
  // The groups are the questions file's own flags, recomputed here from the eval trajectories.
  const flags = new Map(
    readFileSync(join(out, 'data', 'questions.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
      .map((q) => [q.question, q.demonstrated as boolean]),
  );
  for (const s of r.stages) {
    const eps = readFileSync(join(out, 'runs', 'evals', s.stage, 'trajectories.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    // Each group (all, the demonstrated phrasings, the undemonstrated ones) recomputed from the trajectories.
    const groups = {
      all: eps,
      demonstrated: eps.filter((e) => flags.get(e.question) === true),
      undemonstrated: eps.filter((e) => flags.get(e.question) === false),
    };
    for (const [group, es] of Object.entries(groups) as Array<[keyof typeof groups, typeof eps]>) {
      t.equal(es.length, s.scores[group].questions, `${s.stage}: ${es.length} held-out questions (${group})`);
      t.ok(
        Math.abs(es.filter((e) => e.correct).length / es.length - s.scores[group].accuracy) < 1e-9,
        `${s.stage}: ${group} accuracy recomputed`,
      );
    }
  }
  t.ok(by.baseline.all.accuracy < by.sft.all.accuracy, `baseline ${by.baseline.all.accuracy} < SFT ${by.sft.all.accuracy}`);
  // The README's row: "| stage | accuracy % | demonstrated % | undemonstrated % | ..." with each cell
  // "seed 0 / seed 1 / seed 2".
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  for (const stage of ['baseline', 'sft', 'grpo'] as const) {
    const row = new RegExp(`^\\| ${stage} \\| ([^|]+)\\| ([^|]+)\\| ([^|]+)\\|`, 'm').exec(readme);
    t.ok(row, `the README's table has a ${stage} row`);
    if (!row) continue;
    const seed0 = row.slice(1, 4).map((cell) => Number(cell.split('/')[0].trim()));
    const got = [by[stage].all.accuracy, by[stage].demonstrated.accuracy, by[stage].undemonstrated.accuracy].map((x) => x * 100);
    ['all', 'demonstrated', 'undemonstrated'].forEach((group, i) =>
      t.ok(Math.abs(got[i] - seed0[i]) < 0.05 + 1e-9, `${stage}, ${group}: ${got[i].toFixed(1)} % drawn, ${seed0[i]} % in the README`),
    );
  }
});
