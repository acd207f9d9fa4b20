#!/usr/bin/env node
// The README's demo tables from several `slm-train --compare --seed N --out DIR` runs:
//   node scripts/demo-seeds.mjs DIR0 DIR1 DIR2
// reads each DIR/results.json (lib/demo/pipeline.ts) and prints, per stage, every seed's accuracy
// (all, demonstrated phrasings, undemonstrated phrasings), pass@k in the same groups, the sampled
// episodes and the training time; then the per-kind accuracies of the undemonstrated phrasings.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

const dirs = process.argv.slice(2);
if (!dirs.length) {
  console.error('usage: node scripts/demo-seeds.mjs RUN_DIR... (folders of `slm-train --compare` runs, each with results.json)');
  process.exit(2);
}
const runs = dirs.map((d) => JSON.parse(readFileSync(join(d, 'results.json'), 'utf8')));
const stages = runs[0].stages.map((s) => s.stage);
const pct = (x) => (x === undefined ? '–' : (100 * x).toFixed(1));
const per = (stage, f) => runs.map((r) => f(r.stages.find((s) => s.stage === stage))).join(' / ');
const k = runs[0].pass_k;
const s0 = runs[0].stages[0];
console.log(
  `Seeds ${runs.map((r) => r.seed).join(' / ')}; ${s0.all.questions} held-out questions, ${runs.map((r) => r.stages[0].demonstrated.questions).join(' / ')} in demonstrated phrasings and ${runs.map((r) => r.stages[0].undemonstrated.questions).join(' / ')} in undemonstrated ones.\n`,
);
console.log(
  `| stage | accuracy % | demonstrated % | undemonstrated % |${k ? ` pass@${k} demonstrated % | pass@${k} undemonstrated % |` : ''} sampled episodes | train s |`,
);
console.log(`|---|---|---|---|${k ? '---|---|' : ''}---:|---|`);
for (const st of stages)
  console.log(
    `| ${st} | ${per(st, (s) => pct(s.all.accuracy))} | ${per(st, (s) => pct(s.demonstrated.accuracy))} | ${per(st, (s) => pct(s.undemonstrated.accuracy))} |${k ? ` ${per(st, (s) => pct(s.demonstrated.pass_at_k))} | ${per(st, (s) => pct(s.undemonstrated.pass_at_k))} |` : ''} ${runs[0].stages.find((s) => s.stage === st).sampled_episodes} | ${per(st, (s) => s.train_s.toFixed(0))} |`,
  );
const kinds = Object.keys(s0.by_kind);
console.log(
  `\nPer kind, accuracy % in demonstrated / undemonstrated phrasings (seeds ${runs.map((r) => r.seed).join(', ')}; one line per seed):\n`,
);
console.log(`| stage | seed | ${kinds.join(' | ')} |`);
console.log(`|---|---:|${kinds.map(() => '---').join('|')}|`);
for (const st of stages)
  for (const r of runs) {
    const s = r.stages.find((x) => x.stage === st);
    console.log(
      `| ${st} | ${r.seed} | ${kinds.map((kd) => `${pct(s.by_kind[kd].demonstrated.accuracy)} / ${pct(s.by_kind[kd].undemonstrated.accuracy)}`).join(' | ')} |`,
    );
  }
