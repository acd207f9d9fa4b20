// The embedded demo at its full, default size (what `npx slm-train` runs, seed 0): RL improves on
// SFT where the demonstrations did not reach. The expert is consistent and correct and demonstrates
// only two of the four phrasings of each fact; GRPO trains on every training question with an
// exact-match outcome reward and no expert program. Asserted, as the README's table claims: the
// untrained model is below SFT, and GRPO is at least 5 points above SFT on the held-out questions in
// undemonstrated phrasings. Nothing is asserted about how good or bad SFT is. Measured with the
// default 18 SFT epochs at f365d1f and again at abd62f2 (prefills through the fused norm kernels):
// +13.3, +12.5 and +10.4 points for seeds 0, 1 and 2 (the README's table, every row as measured). The gain is a draw: seed 0 under other arithmetic (AVX-512, or an
// intermediate build of f365d1f) gained nothing, so this checks that the code still draws the
// README's row, not that RL always wins. About 3-9 minutes on 2 cores.
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

t.test('npx slm-train (seed 0): GRPO beats SFT on the held-out questions in phrasings no demonstration used', async (t) => {
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
    const unseen = eps.filter((e) => flags.get(e.question) === false);
    t.equal(
      unseen.length,
      s.scores.undemonstrated.questions,
      `${s.stage}: ${unseen.length} held-out questions in undemonstrated phrasings`,
    );
    t.ok(
      Math.abs(unseen.filter((e) => e.correct).length / unseen.length - s.scores.undemonstrated.accuracy) < 1e-9,
      `${s.stage}: undemonstrated accuracy recomputed`,
    );
  }
  t.ok(by.baseline.all.accuracy < by.sft.all.accuracy, `baseline ${by.baseline.all.accuracy} < SFT ${by.sft.all.accuracy}`);
  t.ok(
    by.grpo.undemonstrated.accuracy >= by.sft.undemonstrated.accuracy + 0.05,
    `undemonstrated phrasings: GRPO ${by.grpo.undemonstrated.accuracy} at least 5 points above SFT ${by.sft.undemonstrated.accuracy}`,
  );
});
