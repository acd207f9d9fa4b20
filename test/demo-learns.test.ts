// The embedded demo at its full, default size (what `npx slm-train` runs, seed 0): RL improves on
// SFT where the demonstrations did not reach. The expert is consistent and correct and demonstrates
// only two of the four phrasings of each fact; GRPO trains on every training question with an
// exact-match outcome reward and no expert program. Asserted, as the README's table claims: the
// untrained model is below SFT, and GRPO is at least 5 points above SFT on the held-out questions in
// undemonstrated phrasings. Nothing is asserted about how good or bad SFT is. About 6-8 minutes on 2 cores.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { runDemo } from '../lib/demo/pipeline.js';

t.test('npx slm-train (seed 0): GRPO beats SFT on the held-out questions in phrasings no demonstration used', async (t) => {
  const out = join(t.testdir(), 'demo');
  const r = await runDemo({ out, seed: 0 });
  const by = Object.fromEntries(r.stages.map((s) => [s.stage, s.scores]));
  t.same(Object.keys(by), ['baseline', 'sft', 'grpo']);
  t.ok(r.stages.every((s) => s.summary.questions === 150), 'every stage on the 150 held-out questions');
  // The groups are the questions file's own flags, recomputed here from the eval trajectories.
  const flags = new Map(readFileSync(join(out, 'data', 'questions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).map((q) => [q.question, q.demonstrated as boolean]));
  for (const s of r.stages) {
    const eps = readFileSync(join(out, 'runs', 'evals', s.stage, 'trajectories.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const unseen = eps.filter((e) => flags.get(e.question) === false);
    t.equal(unseen.length, s.scores.undemonstrated.questions, `${s.stage}: ${unseen.length} held-out questions in undemonstrated phrasings`);
    t.ok(Math.abs(unseen.filter((e) => e.correct).length / unseen.length - s.scores.undemonstrated.accuracy) < 1e-9, `${s.stage}: undemonstrated accuracy recomputed`);
  }
  t.ok(by.baseline.all.accuracy < by.sft.all.accuracy, `baseline ${by.baseline.all.accuracy} < SFT ${by.sft.all.accuracy}`);
  t.ok(by.grpo.undemonstrated.accuracy >= by.sft.undemonstrated.accuracy + 0.05, `undemonstrated phrasings: GRPO ${by.grpo.undemonstrated.accuracy} at least 5 points above SFT ${by.sft.undemonstrated.accuracy}`);
});
