// One data-parallel rank for test/distributed.test.ts (runs the compiled dist/): joins the process
// group from RANK/WORLD_SIZE/MASTER_*, loads the model, takes the initial trainables from the spec,
// runs the spec's steps on its share of each global batch, and writes its trainables as JSON.
import { readFileSync, writeFileSync } from 'node:fs';
import { Model } from '../../dist/lib/engine/model.js';
import { ProcessGroup, distEnvFrom } from '../../dist/lib/distributed/group.js';
import { DataParallel, shardRange } from '../../dist/lib/distributed/data-parallel.js';

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const env = distEnvFrom();
const group = await ProcessGroup.join(env, { backend: 'gloo', timeoutS: spec.timeoutS ?? 60, python: spec.python });
const model = await Model.load(spec.model);
model.attachLora(spec.lora, spec.seed);
// Rank 1 starts from different values: the first step must take rank 0's (broadcast).
for (const [k, v] of Object.entries(spec.init))
  model.setTrainable(
    k,
    Float32Array.from(v, (x) => (env.rank === 0 ? x : x + 1)),
  );
const dp = new DataParallel(group);
model.dataParallel = dp;
const stats = [];
for (const step of spec.steps) {
  if (spec.failRank === env.rank) process.exit(3);
  const [lo, hi] = shardRange(step.batch.sequences.length, env.rank, env.world);
  const pick = (rows) => rows?.slice(lo, hi);
  const b = step.batch;
  const s = await model.trainStep(
    { sequences: pick(b.sequences), masks: pick(b.masks), advantages: pick(b.advantages), oldLogprobs: pick(b.oldLogprobs) },
    step.opts,
  );
  stats.push({ ...s, allReduceS: dp.lastAllReduceS, allReduceBytes: dp.lastAllReduceBytes });
}
const out = Object.fromEntries(Object.entries(model.trainable()).map(([k, v]) => [k, Array.from(v)]));
writeFileSync(`${spec.out}.rank${env.rank}.json`, JSON.stringify({ trainable: out, stats }));
await group.close();
model.dispose();
