// protocol.prompts_from_sft: RL and evaluation episodes start from the very system prompt the SFT
// conversations carry, and the final-turn notice they show, read from the data (here the reference
// project's 81 trajectories), not from the code.
import t from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { validateConfig } from '../lib/config/load.js';
import { openEnvironment } from '../lib/train/environment.js';
import { dataFile } from './helpers/shared.js';

const sftFile = dataFile('seed-sft', 'trajectories.jsonl');
// What the SFT stage trains on: the rows not marked in_test_split.
const trained = readFileSync(sftFile, 'utf8')
  .split('\n')
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l) as { in_test_split: boolean; messages: Array<{ role: string; content: string }> })
  .filter((r) => !r.in_test_split);

t.test('the system prompt and final-turn notice come from data.sft', async (t) => {
  const dir = t.testdir();
  const corpus = join(dir, 'corpus.jsonl');
  writeFileSync(corpus, JSON.stringify({ id: 'p', title: 'P', content: '# P\n\n## History\nP was founded in 1200.' }) + '\n');
  const base = {
    stage: 'grpo',
    model: { path: 'unused' },
    data: { questions: 'q.jsonl', corpus, sft: sftFile },
    protocol: { kind: 'code', max_turns: 2 },
    sandbox: { workers: 1 },
    retrieval: { kind: 'bm25' },
  };
  const lines: string[] = [];
  const env = await openEnvironment(validateConfig({ ...base, protocol: { ...base.protocol, prompts_from_sft: true } }, 'test'), (l) =>
    lines.push(l),
  );
  t.teardown(() => env.close());
  const system = env.protocol.initialMessages('In which year was P founded?', 2)[0];
  t.equal(system.role, 'system');
  t.equal(system.content, trained[0].messages[0].content, "the trajectories' system prompt, verbatim");
  t.ok(
    trained.every((r) => r.messages[0].content === system.content),
    'the one every trained row carries',
  );
  t.match(system.content, /You have 2 turns/);
  const reply = await env.protocol.respond(
    { kind: 'code', code: 'print(1)', end: 0 },
    { turn: 1, maxTurns: 2, finishReason: 'stop_string', maxNewTokens: 64, question: 'q' },
  );
  const notice = reply.messages!.at(-1)!.content;
  const last = trained[0].messages;
  t.equal(notice, last[last.length - 2].content, 'the final-turn notice of the trajectories');
  t.match(notice, /^\[FINAL TURN\]/);
  t.match(lines.join('\n'), /prompts: the system prompt of .*\(62 of 62 conversations\), its final-turn notice/);

  // Without the option: the protocol's own prompt, which differs.
  const own = await openEnvironment(validateConfig(base, 'test'));
  t.teardown(() => own.close());
  t.not(own.protocol.initialMessages('q', 2)[0].content, system.content);

  t.throws(() => validateConfig({ ...base, protocol: { ...base.protocol, prompts_from_sft: true, system_prompt: 'x' } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /protocol.system_prompt: set, but protocol.prompts_from_sft takes it from data.sft/,
  });
  t.throws(
    () => validateConfig({ ...base, data: { ...base.data, sft: null }, protocol: { ...base.protocol, prompts_from_sft: true } }, 'test'),
    { code: 'CONFIG_INVALID', message: /data.sft: missing; protocol.prompts_from_sft/ },
  );
});

t.test('retrieval.k is what search_pages returns, and what the default prompt says', async (t) => {
  const dir = t.testdir();
  const corpus = join(dir, 'corpus.jsonl');
  writeFileSync(
    corpus,
    Array.from({ length: 8 }, (_, i) =>
      JSON.stringify({ id: `p${i}`, title: `Town ${i}`, content: `# Town ${i}\n\nTown ${i} is a town by the river.` }),
    ).join('\n') + '\n',
  );
  const cfg = (k: number) =>
    validateConfig(
      {
        stage: 'grpo',
        model: { path: 'unused' },
        data: { questions: 'q.jsonl', corpus },
        protocol: { kind: 'code' },
        sandbox: { workers: 1 },
        retrieval: { kind: 'bm25', k },
      },
      'test',
    );
  for (const k of [3, 5]) {
    const env = await openEnvironment(cfg(k));
    t.teardown(() => env.close());
    const r = await env.protocol.respond(
      { kind: 'code', code: 'print(len(search_pages("town river")))', end: 0 },
      { turn: 1, maxTurns: 3, finishReason: 'stop_string', maxNewTokens: 64 },
    );
    t.match(r.messages![0].content, new RegExp(`<python_output>\\n${k}\\n`), `search_pages gives ${k} pages`);
    t.match(env.protocol.initialMessages('q', 3)[0].content, new RegExp(`the ${k} pages that match best`));
  }
});
