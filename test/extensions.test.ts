// Custom rewards and tools from the config (issue 21, item 4): reward.module and sandbox.tools_module
// name JavaScript modules, resolved against the config file; the reward module's value becomes the
// part `module` of the rewards an evaluation and a GRPO run compute, its tools are callable from
// programs in the real Python (and QuickJS) sandbox, and every way a module can be wrong is a coded
// error naming the file.
import t from 'tap';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../lib/config/load.js';
import { rewardFromConfig } from '../lib/rewards/combine.js';
import { openEnvironment, rewardDeps } from '../lib/train/environment.js';
import { evalFromConfig } from '../lib/train/evaluation.js';
import { trainFromConfig } from '../lib/train/session.js';
import { initModel } from '../lib/model/init.js';
import { loadRewardModule, loadToolsModule } from '../lib/extensions.js';
import { runCli } from './helpers/cli.js';

const root = t.testdir();
const modDir = join(root, 'modules');
const cfgDir = join(root, 'configs');
mkdirSync(modDir);
mkdirSync(cfgDir);
const mod = (name: string, src: string) => {
  writeFileSync(join(modDir, name), src);
  return join(modDir, name);
};
// Rewards the answer format "Final: X" (EM alone scores it 0), and reports what it was given.
mod(
  'format.mjs',
  `export function reward(ctx) { return { score: /^Final: /.test(ctx.answer ?? '') ? 1 : 0, parts: { saw_turns: ctx.episode?.turns ?? -1 } }; }\n`,
);
mod('by-id.mjs', `export default async (ctx) => (ctx.id === 'b' ? 3 : 1);\n`);
mod('nan.mjs', `export const reward = () => NaN;\n`);
mod('string.mjs', `export const reward = () => 'good';\n`);
mod('undefined.mjs', `export const reward = () => {};\n`);
mod('score-string.mjs', `export const reward = () => ({ score: '1' });\n`);
mod('throws.mjs', `export const reward = () => { throw new Error('my reward broke'); };\n`);
mod('syntax.mjs', `export const reward = (ctx) => {{ ;\n`);
mod('no-export.mjs', `export const other = 1;\n`);
mod(
  'tools.mjs',
  `export const tools = {
  word_count: (text) => text.split(/\\s+/).filter(Boolean).length,
  lookup: async (key, n) => ({ key: key.toUpperCase(), n: n * 2, list: [1, 2] }),
  boom: () => { throw new Error('tool exploded'); },
};\n`,
);
mod('tools-default.mjs', `export default { shout: (s) => s + '!' };\n`);
mod('tools-reserved.mjs', `export const tools = { search_pages: () => [] };\n`);
mod('tools-not-fn.mjs', `export const tools = { x: 42 };\n`);
mod('tools-syntax.mjs', `export const tools = {;\n`);

const corpus = join(root, 'corpus.jsonl');
writeFileSync(
  corpus,
  [
    { id: 'paris', title: 'Paris', content: '# Paris\n\nParis is the capital of France.' },
    { id: 'rome', title: 'Rome', content: '# Rome\n\nRome is the capital of Italy.' },
  ]
    .map((p) => JSON.stringify(p))
    .join('\n') + '\n',
);
const questions = join(root, 'questions.jsonl');
writeFileSync(
  questions,
  [
    { id: 'a', question: 'What is the capital of France?', answer: 'Paris' },
    { id: 'b', question: 'What is the capital of Italy?', answer: 'Rome' },
  ]
    .map((q) => JSON.stringify(q))
    .join('\n') + '\n',
);

const EVAL = 'stage: eval\nmodel: { path: m }\ndata: { questions: ../questions.jsonl, corpus: ../corpus.jsonl }\n';

/** A config file in configs/ naming modules as ../modules/NAME (relative to the file). */
function config(name: string, body: string): string {
  const f = join(cfgDir, `${name}.yaml`);
  writeFileSync(f, body);
  return f;
}

t.test('reward.module and sandbox.tools_module are resolved against the config file', async (t) => {
  const f = config('paths', `${EVAL}reward: { module: ../modules/format.mjs }\nsandbox: { tools_module: ../modules/tools.mjs }\n`);
  const cfg = loadConfig(f, [], { cwd: '/' });
  t.equal(cfg.reward.module, join(modDir, 'format.mjs'));
  t.equal(cfg.sandbox.tools_module, join(modDir, 'tools.mjs'));
  const d = loadConfig(config('defaults', EVAL + ''));
  t.equal(d.reward.module, null);
  t.equal(d.sandbox.tools_module, null);
});

t.test('a reward module is the part `module` of the composed reward', async (t) => {
  const ctx = (answer: string | null, id = 'q1') => ({
    answer,
    golds: ['Paris'],
    question: 'What is the capital of France?',
    id,
    episode: { turns: 2 },
  });
  const base = loadConfig(config('em', EVAL + ''));
  const plain = rewardFromConfig(base.reward, (await rewardDeps(base, () => {})).deps);
  t.equal((await plain(ctx('Final: Paris'))).total, 0, 'EM alone: the formatted answer scores 0');
  const lines: string[] = [];
  const cfg = loadConfig(config('format', EVAL + 'reward: { module: ../modules/format.mjs }\n'));
  const fn = rewardFromConfig(cfg.reward, (await rewardDeps(cfg, (l) => lines.push(l))).deps);
  const r = await fn(ctx('Final: Paris'));
  t.equal(r.total, 1, 'em 0 + module 1');
  t.same(r.parts, { em: 0, saw_turns: 2, module: 1 }, 'the module part, and its extra parts, with the episode it was given');
  t.equal((await fn(ctx('Paris'))).total, 1, 'em 1 + module 0');
  t.equal((await fn(ctx(null))).total, 0);
  t.match(lines.join('\n'), /reward: module .*format\.mjs/, 'the log names the module');
  // weighted, as a listed part
  const w = loadConfig(
    config('weighted', EVAL + 'reward: { module: ../modules/format.mjs, parts: [{ kind: module, weight: 0.5, name: style }] }\n'),
  );
  const wf = rewardFromConfig(w.reward, (await rewardDeps(w, () => {})).deps);
  const wr = await wf(ctx('Final: Paris'));
  t.equal(wr.total, 0.5, 'only the listed module part, weighted');
  t.same(wr.parts, { saw_turns: 2, style: 1 });
  // a {kind: module} part without reward.module
  const none = loadConfig(config('none', EVAL + 'reward: { parts: [{ kind: module }] }\n'));
  t.throws(() => rewardFromConfig(none.reward, {}), { code: 'CONFIG_INVALID', message: /reward\.module/ });
  // a function given in code takes the module's place
  const code = rewardFromConfig(base.reward, (await rewardDeps(base, () => {}, { reward: (c) => (c.id === 'q9' ? 5 : 0) })).deps);
  t.equal((await code(ctx('x', 'q9'))).total, 5, 'the id reaches the function');
});

t.test('a reward module that is wrong is REWARD_MODULE_INVALID naming the file', async (t) => {
  for (const [file, why] of [
    ['missing.mjs', /does not exist/],
    ['syntax.mjs', /could not be imported/],
    ['no-export.mjs', /exports no reward function.*other/],
  ] as const) {
    const f = join(modDir, file);
    await t.rejects(
      loadRewardModule(f),
      { code: 'REWARD_MODULE_INVALID', message: new RegExp(`${f.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}[\\s\\S]*${why.source}`) },
      file,
    );
    const cfg = loadConfig(config(`bad-${file}`, `${EVAL}reward: { module: ../modules/${file} }\n`));
    await t.rejects(
      rewardDeps(cfg, () => {}),
      { code: 'REWARD_MODULE_INVALID', message: new RegExp(file.replace('.', '\\.')) },
      `${file} through the config`,
    );
  }
  for (const [file, shown] of [
    ['nan.mjs', 'NaN'],
    ['string.mjs', '"good"'],
    ['undefined.mjs', 'undefined'],
    ['score-string.mjs', 'score'],
  ] as const) {
    const cfg = loadConfig(config(`ret-${file}`, `${EVAL}reward: { module: ../modules/${file} }\n`));
    const fn = rewardFromConfig(cfg.reward, (await rewardDeps(cfg, () => {})).deps);
    const err = await fn({ answer: 'x', golds: ['y'], question: 'q?', id: 'q42' }).then(
      () => null,
      (e) => e,
    );
    t.equal(err?.code, 'REWARD_MODULE_INVALID', `${file}: the run stops`);
    t.match(err?.message, file, 'names the file');
    t.match(err?.message, '"q42"', 'names the question');
    t.match(err?.message, shown, `says what it returned (${shown})`);
  }
  // A function that throws is a failed component (as a failed judge call), recorded, not a crash.
  const th = loadConfig(config('throws', EVAL + 'reward: { module: ../modules/throws.mjs }\n'));
  const errors: string[] = [];
  const fn = rewardFromConfig(th.reward, (await rewardDeps(th, (l) => errors.push(l))).deps);
  const r = await fn({ answer: 'Paris', golds: ['Paris'], question: 'q?', id: 'a' });
  t.equal(r.failed, true);
  t.equal(r.parts.module_error, 1);
  t.match(r.errors.module, 'my reward broke');
  t.equal(r.total, 1, 'em 1, the failed module part 0 (failure_value)');
  t.match(errors.join('\n'), /module failed: my reward broke/);
});

t.test('a tools module gives programs its functions, in the Python and the QuickJS sandbox', async (t) => {
  const programs = {
    python: [
      'print(word_count("a b  c"))',
      'r = lookup("x", 2)',
      'print(r["key"], r["n"], r["list"])',
      'try:',
      '    boom()',
      'except ValueError as e:',
      '    print("caught", e)',
      'print(search_pages("capital of France")[0]["page_id"])',
    ].join('\n'),
    quickjs: [
      'console.log(word_count("a b  c"));',
      'const r = lookup("x", 2);',
      'console.log(r.key, r.n, r.list.length);',
      'try { boom(); } catch (e) { console.log("caught", e.message); }',
      'console.log(search_pages("capital of France")[0].page_id);',
    ].join('\n'),
  };
  for (const kind of ['python', 'quickjs'] as const) {
    const cfg = loadConfig(
      config(
        `tools-${kind}`,
        `stage: grpo\nmodel: { path: m }\ndata: { questions: ../questions.jsonl, corpus: ../corpus.jsonl }\nprotocol: { kind: code }\nretrieval: { kind: bm25 }\nsandbox: { kind: ${kind}, workers: 1, tools_module: ../modules/tools.mjs }\n`,
      ),
    );
    const lines: string[] = [];
    const env = await openEnvironment(cfg, (l) => lines.push(l));
    try {
      const r = await env.sandbox!.run(programs[kind]);
      t.equal(r.error, null, `${kind}: ${r.stdout}`);
      const out = r.stdout.trim().split('\n');
      t.equal(out[0], '3', `${kind}: a synchronous tool`);
      t.match(
        out[1],
        kind === 'python' ? /^X 4 \[1, 2\]$/ : /^X 4 2$/,
        `${kind}: an async tool with two JSON arguments and an object result`,
      );
      t.match(out[2], /^caught .*tool exploded/, `${kind}: a tool that throws raises in the program`);
      t.equal(out[3], 'paris', `${kind}: the search tools still work`);
      t.same(
        r.calls.map((c) => [c.name, c.ok]),
        [
          ['word_count', true],
          ['lookup', true],
          ['boom', false],
          ['search_pages', true],
        ],
        `${kind}: the calls are recorded`,
      );
      t.match(lines.join('\n'), /tools: word_count, lookup, boom from .*tools\.mjs/);
    } finally {
      await env.close();
    }
  }
  t.same(Object.keys(await loadToolsModule(join(modDir, 'tools-default.mjs'))), ['shout'], 'a default export works');
});

t.test('a tools module that is wrong is TOOLS_MODULE_INVALID naming the file', async (t) => {
  for (const [file, why] of [
    ['missing.mjs', /does not exist/],
    ['tools-syntax.mjs', /could not be imported/],
    ['no-export.mjs', /must export `tools`/],
    ['tools-reserved.mjs', /"search_pages" is taken/],
    ['tools-not-fn.mjs', /tool "x" is 42 \(number\); expected a function/],
  ] as const) {
    await t.rejects(loadToolsModule(join(modDir, file)), { code: 'TOOLS_MODULE_INVALID', message: why }, file);
    const cfg = loadConfig(
      config(
        `tbad-${file}`,
        `stage: grpo\nmodel: { path: m }\ndata: { questions: ../questions.jsonl, corpus: ../corpus.jsonl }\nprotocol: { kind: code }\nretrieval: { kind: bm25 }\nsandbox: { workers: 1, tools_module: ../modules/${file} }\n`,
      ),
    );
    await t.rejects(
      openEnvironment(cfg),
      { code: 'TOOLS_MODULE_INVALID', message: new RegExp(file.replace('.', '\\.')) },
      `${file} through the config`,
    );
  }
});

t.test('the reward module changes the rewards of an evaluation and a GRPO run', async (t) => {
  const model = initModel({ preset: 'tiny', out: join(root, 'model') }).dir;
  const common = `model: { path: ${model} }\ndata: { questions: ../questions.jsonl, split: { train_fraction: 1 } }\nprotocol: { kind: direct, max_turns: 1, max_new_tokens: 4 }\nrollout: { k: 2, batch_questions: 2 }\neval: { split: all }\nrun: { dir: ${join(root, 'runs')} }\n`;
  const plain = await evalFromConfig(loadConfig(config('eval-plain', `stage: eval\n${common}`)), { label: 'plain' });
  t.equal(plain.summary.reward, 0, 'EM alone: the random model scores 0');
  const ev = await evalFromConfig(loadConfig(config('eval-module', `stage: eval\n${common}reward: { module: ../modules/by-id.mjs }\n`)), {
    label: 'module',
  });
  t.equal(ev.summary.reward, 2, 'the mean of the module (1 for a, 3 for b) plus EM 0');
  const rows = readFileSync(join(ev.dir, 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  t.same(
    rows.map((r) => [r.id, r.parts.module, r.reward]),
    [
      ['a', 1, 1],
      ['b', 3, 3],
    ],
    'per question, by its id',
  );
  await t.rejects(
    evalFromConfig(loadConfig(config('eval-nan', `stage: eval\n${common}reward: { module: ../modules/nan.mjs }\n`)), { label: 'nan' }),
    { code: 'REWARD_MODULE_INVALID', message: /nan\.mjs: the reward function returned NaN for question "a"/ },
    'a non-number stops the evaluation',
  );
  // GRPO: one step, the module's reward only
  const g = await trainFromConfig(
    loadConfig(
      config(
        'grpo-module',
        `stage: grpo\n${common}train: { steps: 1 }\nreward: { module: ../modules/by-id.mjs, parts: [{ kind: module }] }\n`,
      ),
    ),
  );
  t.equal(g.steps, 1);
  t.same(g.meanReward, [2], 'the step trained on the module reward: mean of 1, 1, 3, 3');
  const metrics = readFileSync(join(g.dir, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  t.equal(metrics.find((m) => m.step === 1)?.['reward/module'], 2, 'logged as reward/module');
});

t.test("slm-train exec --tools-module: a scripted program calls the module's tools in the Python sandbox", async (t) => {
  const prog = join(root, 'prog.py');
  writeFileSync(prog, 'print(word_count("one two three four"))\nprint(lookup("k", 5)["n"])\n');
  const r = runCli(['exec', '--corpus', corpus, '--file', prog, '--tools-module', join(modDir, 'tools.mjs'), '--json'], {
    timeout: 120_000,
  });
  t.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout);
  t.equal(out.error, null);
  t.equal(out.stdout, '4\n10\n', 'the tools answered');
  t.same(
    out.calls.map((c: { name: string; ok: boolean }) => [c.name, c.ok]),
    [
      ['word_count', true],
      ['lookup', true],
    ],
  );
  const bad = runCli(['exec', '--corpus', corpus, '--file', prog, '--tools-module', join(modDir, 'tools-reserved.mjs'), '--json'], {
    timeout: 120_000,
  });
  t.not(bad.code, 0, 'a wrong module fails the command');
  t.match(bad.stderr, /TOOLS_MODULE_INVALID[\s\S]*tools-reserved\.mjs/, 'with the code and the file');
  const none = runCli(['exec', '--corpus', corpus, '--file', prog, '--json'], { timeout: 120_000 });
  t.match(JSON.parse(none.stdout).error, /NameError: name 'word_count' is not defined/, 'without the module the name does not exist');
});
