// A tiny RL stage on disk for tests that run a stage end to end through trainFromConfig: a random
// `tiny` model, four questions, a reward module that differs between rollouts of a random model (the
// length of the last reply, mod 5), and the config file (the stage's own keys in `extra`).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { initModel } from '../../lib/model/init.js';

/** Writes the stage's files under `root`; returns the config file's path. */
export function writeTinyRlStage(root: string, stage: string, extra = ''): string {
  const model = initModel({ preset: 'tiny', out: join(root, 'model') }).dir;
  mkdirSync(join(root, 'modules'));
  writeFileSync(
    join(root, 'modules', 'len.mjs'),
    `export const reward = (ctx) => (ctx.episode?.messages?.at(-1)?.content ?? '').length % 5;\n`,
  );
  writeFileSync(
    join(root, 'questions.jsonl'),
    ['a', 'b', 'c', 'd'].map((id, i) => JSON.stringify({ id, question: `Question number ${i}?`, answer: 'x' })).join('\n') + '\n',
  );
  const file = join(root, `${stage}.yaml`);
  writeFileSync(
    file,
    `stage: ${stage}\nmodel: { path: ${model} }\ndata: { questions: questions.jsonl, split: { train_fraction: 1 } }\nprotocol: { kind: direct, max_turns: 1, max_new_tokens: 6 }\nrollout: { k: 3, batch_questions: 2 }\nreward: { module: modules/len.mjs, parts: [{ kind: module }] }\nlora: { r: 4, alpha: 8 }\noptim: { lr: 0.01 }\nrun: { dir: ${join(root, 'runs')} }\n${extra}`,
  );
  return file;
}
