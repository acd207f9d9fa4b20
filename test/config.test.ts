// The training config: ready files validate; defaults; unknown keys with suggestions; type errors;
// overrides (parsing, precedence, paths); the resolved config written into a run folder.
import t from 'tap';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  CONFIG_SCHEMA,
  applyOverrides,
  expectedOf,
  groupAdvantageOptions,
  loadConfig,
  missingFiles,
  parseOverrides,
  ppoAdvantageOptions,
  runDir,
  scheduleSpec,
  suggestKey,
  validateConfig,
  writeResolvedConfig,
  type ResolvedConfig,
} from '../lib/config/index.js';
import type { SlmError } from '../lib/errors.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const configs = join(root, 'configs');

function errorOf(f: () => unknown): SlmError {
  try {
    f();
  } catch (e) {
    return e as SlmError;
  }
  throw new Error('expected an error');
}

const minimal = { stage: 'sft', model: { path: '/m' }, data: { sft: '/d.jsonl' } };

t.test('every file in configs/ validates', async (t) => {
  const files = readdirSync(configs).filter((f) => f.endsWith('.yaml'));
  t.ok(files.length >= 3, `${files.length} configs`);
  for (const f of files) {
    const c = loadConfig(join(configs, f));
    t.ok(c.model.path.startsWith(resolve(root)), `${f}: model.path resolved against configs/ (${c.model.path})`);
    t.equal(c.run.name, f.replace(/\.yaml$/, ''), `${f}: run name`);
  }
});

t.test('the ready configs hold the reference settings', async (t) => {
  const sft = loadConfig(join(configs, 'code-sft.yaml'));
  t.same([sft.stage, sft.lora.r, sft.lora.alpha, sft.train.epochs], ['sft', 16, 32, 8]);
  t.equal(sft.data.sft, join(root, 'data/seed-sft/trajectories.jsonl'), 'relative to the config file');

  const g = loadConfig(join(configs, 'code-grpo.yaml'));
  t.same(
    [
      g.stage,
      g.algorithm.kind,
      g.rollout.k,
      g.rollout.batch_questions,
      g.protocol.max_turns,
      g.protocol.max_new_tokens,
      g.protocol.max_context,
      g.protocol.tool_output_chars,
    ],
    ['grpo', 'grpo', 24, 1, 2, 356, 3000, 6000],
  );
  t.same(
    [g.optim.lr, g.optim.weight_decay, g.optim.schedule, g.rollout.temperature, g.optim.max_grad_norm, g.optim.gradient_checkpointing],
    [1e-5, 0.01, 'constant', [0.7, 1.15], 1, true],
  );
  t.same([g.lora.r, g.lora.alpha, g.lora.dropout, g.lora.targets], [16, 32, 0.1, ['q_proj', 'k_proj', 'v_proj', 'o_proj']]);
  t.same(
    [g.reward.combine, g.reward.on_failure, g.reward.parts.map((p) => p.kind)],
    ['sign_magnitude', 'penalty', ['judge_correctness', 'judge_approach']],
  );
  t.same(
    [
      g.algorithm.std_estimator,
      g.algorithm.adv_eps,
      g.algorithm.kl_coef,
      g.algorithm.entropy_coef,
      g.algorithm.loss_norm,
      g.algorithm.turn_discount,
    ],
    ['population', 1e-8, 0, 0.05, 'turn', 0.99],
  );
  t.same(
    [
      g.algorithm.fallbacks.flat_std,
      g.algorithm.fallbacks.flat_skip_below,
      g.algorithm.fallbacks.all_failed,
      g.algorithm.fallbacks.zero_variance,
      g.algorithm.fallbacks.center,
    ],
    [0.01, -2, 'normalize', 'center', 0.5],
  );
  t.equal(g.protocol.prompts_from_sft, true, "RL and eval under the SFT trajectories' prompt");
  t.equal(g.data.sft, join(root, 'data/seed-sft/trajectories.jsonl'));
  t.same(
    [sft.lora.dropout, sft.optim.lr, sft.optim.schedule, sft.optim.weight_decay, sft.train.batch_size, sft.protocol.max_context],
    [0.1, 1e-5, 'linear', 0.01, 4, 3000],
  );

  const p = loadConfig(join(configs, 'search-r1-ppo.yaml'));
  // Search-R1's train_ppo.sh, with LoRA's ten-times learning rates.
  t.same(
    [
      p.stage,
      p.algorithm.kind,
      p.rollout.batch_questions,
      p.algorithm.mini_batch,
      p.train.steps,
      p.optim.warmup_steps,
      p.optim.lr,
      p.optim.critic_lr,
      p.algorithm.kl_coef,
    ],
    ['ppo', 'ppo', 512, 256, 1005, 286, 1e-5, 1e-4, 0.001],
  );
  // The SFT+PPO report's PPO stage: batch 32 in one mini-batch, 600 steps, from an SFT adapter.
  const r = loadConfig(join(configs, 'search-r1-sft-ppo.yaml'));
  t.same(
    [
      r.stage,
      r.rollout.batch_questions,
      r.algorithm.mini_batch,
      r.train.steps,
      r.optim.lr,
      r.optim.critic_lr,
      r.algorithm.kl_coef,
      r.protocol.max_turns,
      r.protocol.max_new_tokens,
    ],
    ['ppo', 32, 32, 600, 1e-5, 1e-4, 0.001, 2, 500],
  );
  t.same(
    [loadConfig(join(configs, 'search-r1-sft.yaml')).stage, loadConfig(join(configs, 'search-r1-sft.yaml')).protocol.kind],
    ['sft', 'tags'],
  );
  t.same([p.algorithm.kl_in, p.algorithm.kl_estimator, p.algorithm.gamma, p.algorithm.lam], ['reward', 'k1', 1, 1]);
  t.same(
    [p.protocol.kind, p.protocol.max_turns, p.protocol.max_turns_eval, p.protocol.top_k, p.protocol.max_new_tokens],
    ['tags', 2, 2, 3, 500],
    'train_ppo.sh validates with its max_turns',
  );
  t.same(p.reward.parts, [{ kind: 'em', weight: 1 }]);
});

t.test('defaults fill every key the schema knows', async (t) => {
  const c = validateConfig(minimal, 'test', { name: 'x' });
  const walk = (s: Record<string, unknown>, v: unknown, path: string) => {
    const props = s.properties as Record<string, Record<string, unknown>> | undefined;
    if (!props) return;
    for (const [k, sub] of Object.entries(props)) {
      const here = (v as Record<string, unknown>)[k];
      t.not(here, undefined, `${path}${k} has a value`);
      walk(sub, here, `${path}${k}.`);
    }
  };
  walk(CONFIG_SCHEMA, c, '');
  t.same(c.lora, { r: 16, alpha: 32, dropout: 0.05, rslora: false, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj'], layers: null });
  t.same(c.data.split, { train_fraction: 0.8, seed: null });
  t.equal(c.algorithm.std_estimator, 'sample');
  t.equal(c.rollout.temperature, 1);
  // Derived defaults.
  t.equal(c.algorithm.kind, 'sft');
  t.equal(c.algorithm.clip_high, c.algorithm.clip_low);
  t.equal(c.protocol.max_turns_eval, c.protocol.max_turns);
  t.same([c.algorithm.kl_in, c.algorithm.kl_estimator], ['loss', 'k3']);
  t.equal(c.run.name, 'x');
  const ppo = validateConfig({ stage: 'ppo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } }, 'test');
  t.same([ppo.algorithm.kl_in, ppo.algorithm.kl_estimator], ['reward', 'k1']);
  // The input is not modified.
  t.same(minimal, { stage: 'sft', model: { path: '/m' }, data: { sft: '/d.jsonl' } });
});

t.test('unknown keys: the path and a suggestion', async (t) => {
  const e = errorOf(() => validateConfig({ ...minimal, optim: { lerning_rate: 1e-4 } }, 'a.yaml'));
  t.equal(e.code, 'CONFIG_UNKNOWN_KEY');
  t.equal(e.message, 'a.yaml: optim.lerning_rate: unknown key; did you mean optim.lr?');
  t.match(
    errorOf(() => validateConfig({ ...minimal, lora: { rnak: 8 } }, 'a.yaml')).message,
    'lora.rnak: unknown key; did you mean lora.r?',
  );
  t.match(
    errorOf(() => validateConfig({ ...minimal, lora: { target_modules: ['q_proj'] } }, 'a.yaml')).message,
    'did you mean lora.targets?',
  );
  t.match(
    errorOf(() => validateConfig({ ...minimal, train: { lr: 1 } }, 'a.yaml')).message,
    'train.lr: unknown key; did you mean optim.lr?',
  );
  t.match(errorOf(() => validateConfig({ ...minimal, optimizer: {} }, 'a.yaml')).message, 'optimizer: unknown key; did you mean optim?');
  t.match(errorOf(() => validateConfig({ ...minimal, rollout: { num_generations: 8 } }, 'a.yaml')).message, 'did you mean rollout.k?');
  t.match(
    errorOf(() => validateConfig({ ...minimal, data: { sft: '/d', split: { trian_fraction: 0.5 } } }, 'a.yaml')).message,
    'data.split.trian_fraction: unknown key; did you mean data.split.train_fraction?',
  );
  t.match(
    errorOf(() => validateConfig({ ...minimal, run: { zzzzzz: 1 } }, 'a.yaml')).message,
    'run.zzzzzz: unknown key; expected one of dir, name',
  );
  // Reward parts and the judge belong to lib/rewards: anything goes inside them.
  t.doesNotThrow(() =>
    validateConfig(
      { ...minimal, reward: { parts: [{ kind: 'f1', anything: [1] }], judge: { endpoint: 'http://x', model: 'y' } } },
      'a.yaml',
    ),
  );
  t.equal(suggestKey([], 'learning_rate'), 'optim.lr');
  t.equal(suggestKey(['algorithm'], 'gae_lambda'), 'algorithm.lam');
  t.equal(suggestKey(['algorithm'], 'qqqqqqqqqq'), undefined);
});

t.test('wrong types and values: expected and found, with the path; every problem at once', async (t) => {
  const e = errorOf(() =>
    validateConfig(
      {
        stage: 'grpo',
        model: { path: '/m', dtype: 'fp8' },
        optim: { lr: 'fast', betas: [0.9] },
        lora: { r: 0, targets: ['q_proj', 'qproj'], dropout: true },
        rollout: { temperature: 'hot' },
        algorithm: { kind: 'dpo' },
        data: { questions: '/q', corpus: '/c' },
        oops: 1,
      },
      'b.yaml',
    ),
  );
  t.equal(e.code, 'CONFIG_INVALID', 'unknown keys mixed with other problems: CONFIG_INVALID');
  const lines = e.message.split('\n');
  t.equal(lines[0], 'b.yaml: 9 problems:');
  t.match(e.message, '  - oops: unknown key');
  t.match(e.message, '  - model.dtype: expected one of "float32", "bfloat16", "float16", found "fp8" (string)');
  t.match(e.message, '  - optim.lr: expected a number > 0, found "fast" (string)');
  t.match(e.message, '  - optim.betas: expected a list of 2 numbers >= 0 and < 1, found a list of 1 ([0.9])');
  t.match(e.message, '  - lora.r: expected an integer >= 1, found 0 (number)');
  t.match(
    e.message,
    '  - lora.targets[1]: expected one of "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", found "qproj" (string); did you mean "q_proj"?',
  );
  t.match(e.message, '  - lora.dropout: expected a number >= 0 and < 1, found true (boolean)');
  t.match(e.message, '  - rollout.temperature: expected a number >= 0 or a list of 2 numbers >= 0, found "hot" (string)');
  t.match(e.message, '  - algorithm.kind: expected one of "grpo", "ppo", "rloo", "rft", "sft" or null, found "dpo" (string)');
  t.match(
    errorOf(() => validateConfig({ stage: 'sft', data: { sft: '/d' } }, 'c.yaml')).message,
    'c.yaml: model.path: missing; expected a string',
  );
  t.match(
    errorOf(() => validateConfig({ stage: 'sft', model: {} }, 'c.yaml')).message,
    'model.path: missing; expected a string (a Hugging Face model folder',
  );
  t.match(
    errorOf(() => validateConfig({ stage: 'train', model: { path: '/m' } }, 'c.yaml')).message,
    'stage: expected one of "sft", "grpo", "ppo", "rloo", "rft", "eval", found "train" (string)',
  );
  t.match(
    errorOf(() => validateConfig({ ...minimal, model: { path: '/m', device: 'gpu' } }, 'c.yaml')).message,
    'model.device: expected a string matching',
  );
  t.match(
    errorOf(() => validateConfig({ ...minimal, lora: { targets: ['q_proj', 'q_proj'] } }, 'c.yaml')).message,
    'lora.targets: expected a list of names',
  );
  t.match(errorOf(() => validateConfig([1], 'c.yaml')).message, 'expected a mapping of sections');
  t.equal(expectedOf({ type: ['integer', 'null'], minimum: 1 }), 'an integer >= 1 or null');
});

t.test('cross-key checks', async (t) => {
  const base = { stage: 'grpo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };
  t.match(
    errorOf(() => validateConfig({ ...base, algorithm: { kind: 'ppo' } }, 'x')).message,
    'algorithm.kind: "ppo" does not match stage "grpo"',
  );
  t.match(
    errorOf(() => validateConfig({ ...base, rollout: { temperature: [1.2, 0.7] } }, 'x')).message,
    'rollout.temperature: expected [lo, hi] with lo <= hi, found [1.2, 0.7]',
  );
  t.match(errorOf(() => validateConfig({ ...base, rollout: { k: 1 } }, 'x')).message, 'rollout.k: GRPO compares the rollouts of a group');
  // RLOO's leave-one-out baseline needs a second rollout: refused here, before any model loads (issue 37).
  const rloo = errorOf(() => validateConfig({ ...base, stage: 'rloo', rollout: { k: 1 } }, 'x'));
  t.equal(rloo.code, 'CONFIG_INVALID');
  t.match(
    rloo.message,
    "rollout.k: RLOO's baseline for a rollout is the mean reward of its group's other rollouts: expected an integer >= 2, found 1; set rollout.k to 2 or more",
  );
  t.doesNotThrow(() => validateConfig({ ...base, stage: 'rloo', rollout: { k: 2 } }, 'x'));
  t.match(errorOf(() => validateConfig({ stage: 'sft', model: { path: '/m' } }, 'x')).message, 'data.sft: missing; the sft stage needs');
  t.match(
    errorOf(() => validateConfig({ stage: 'eval', model: { path: '/m' }, data: { questions: '/q' } }, 'x')).message,
    'data.corpus: missing; the code protocol searches a corpus',
  );
  t.doesNotThrow(() =>
    validateConfig({ stage: 'eval', model: { path: '/m' }, data: { questions: '/q' }, protocol: { kind: 'direct' } }, 'x'),
  );
  t.match(
    errorOf(() => validateConfig({ ...base, algorithm: { kl_estimator: 'k2' } }, 'x')).message,
    'algorithm.kl_estimator: the KL term in the loss supports k3, found "k2"',
  );
  t.match(
    errorOf(() => validateConfig({ ...base, optim: { schedule: 'cosine', warmup_steps: 10 }, train: { steps: 10 } }, 'x')).message,
    'optim.warmup_steps: expected fewer warm-up steps',
  );
});

t.test('overrides: parsing', async (t) => {
  const o = parseOverrides([
    'optim.lr=1e-5',
    'rollout.temperature=[0.7,1.15]',
    'optim.gradient_checkpointing=false',
    'train.steps=null',
    'run.name=my run',
    'lora.targets=q_proj,v_proj',
    'rollout.temperature=0.6,0.9',
    'reward.judge.model=gpt-x',
    'reward.parts.0.weight=0.5',
    'model.path=a=b',
  ]);
  t.same(
    o.map((x) => [x.path.join('.'), x.value]),
    [
      ['optim.lr', 1e-5],
      ['rollout.temperature', [0.7, 1.15]],
      ['optim.gradient_checkpointing', false],
      ['train.steps', null],
      ['run.name', 'my run'],
      ['lora.targets', ['q_proj', 'v_proj']],
      ['rollout.temperature', [0.6, 0.9]],
      ['reward.judge.model', 'gpt-x'],
      ['reward.parts.0.weight', 0.5],
      ['model.path', 'a=b'],
    ],
  );
  t.same(parseOverrides(['run.name=a: b: c'])[0].value, 'a: b: c', 'text that is not YAML stays a string');
  const e = errorOf(() => parseOverrides(['optim.lerning_rate=1e-4', 'nonsense', 'algorithm.fallbacks.centre=0.4']));
  t.equal(e.code, 'CONFIG_INVALID');
  t.match(e.message, 'optim.lerning_rate: unknown key in override "optim.lerning_rate=1e-4"; did you mean optim.lr?');
  t.match(e.message, 'override "nonsense" is not key=value');
  t.match(e.message, 'algorithm.fallbacks.centre: unknown key in override');
  t.match(e.message, 'did you mean algorithm.fallbacks.center?');
  t.equal(errorOf(() => parseOverrides(['optim.lerning_rate=1e-4'])).code, 'CONFIG_UNKNOWN_KEY');
  t.match(errorOf(() => parseOverrides(['stage.x=1'])).message, 'stage.x: unknown key');
  t.same(
    applyOverrides({ a: { b: 1 } }, [
      { path: ['a', 'c'], value: 2, text: '' },
      { path: ['d', '0', 'e'], value: 3, text: '' },
    ]),
    { a: { b: 1, c: 2 }, d: [{ e: 3 }] },
  );
  t.throws(() => applyOverrides({ a: 5 }, [{ path: ['a', 'c'], value: 2, text: 'a.c=2' }]), {
    code: 'CONFIG_INVALID',
    message: /a is 5 \(number\), not a section/,
  });
});

t.test('overrides: precedence, validation and paths', async (t) => {
  const dir = t.testdir({
    sub: {
      'c.yaml': [
        'stage: grpo',
        'model: {path: ./model}',
        'data: {questions: q.jsonl, corpus: /abs/c.jsonl}',
        'optim: {lr: 0.001}',
        'retrieval: {embedder: hashing}',
        '',
      ].join('\n'),
    },
    cwd: {},
  });
  const file = join(dir, 'sub', 'c.yaml');
  const cwd = join(dir, 'cwd');
  const c = loadConfig(file, [], { cwd });
  t.equal(c.optim.lr, 0.001, 'file over defaults');
  t.equal(c.model.path, join(dir, 'sub', 'model'), 'file paths relative to the file');
  t.equal(c.data.questions, join(dir, 'sub', 'q.jsonl'));
  t.equal(c.data.corpus, '/abs/c.jsonl');
  t.equal(c.retrieval.embedder, 'hashing', '"hashing" is not a path');
  t.equal(c.run.dir, join(cwd, 'runs'), 'run.dir relative to the working directory');
  t.equal(runDir(c), join(cwd, 'runs', 'c'));
  const o = loadConfig(file, ['optim.lr=1e-5', 'optim.lr=2e-5', 'data.questions=mine.jsonl', 'retrieval.embedder=emb', 'rollout.k=4'], {
    cwd,
  });
  t.equal(o.optim.lr, 2e-5, 'overrides over the file, the last one wins');
  t.equal(o.data.questions, join(cwd, 'mine.jsonl'), 'override paths relative to the working directory');
  t.equal(o.retrieval.embedder, join(cwd, 'emb'));
  t.equal(o.model.path, join(dir, 'sub', 'model'), 'untouched paths stay relative to the file');
  t.equal(o.rollout.k, 4);
  // Overrides are validated like the file, and say so.
  const e = errorOf(() => loadConfig(file, ['optim.lr=fast'], { cwd }));
  t.equal(e.message, `${file}: optim.lr: expected a number > 0, found "fast" (string) (set on the command line)`);
  t.match(errorOf(() => loadConfig(file, ['stage=sft'], { cwd })).message, 'data.sft: missing');
  t.same(missingFiles(c), [
    `model.path: ${join(dir, 'sub', 'model')}`,
    `data.questions: ${join(dir, 'sub', 'q.jsonl')}`,
    'data.corpus: /abs/c.jsonl',
  ]);
});

t.test('file errors', async (t) => {
  const dir = t.testdir({
    'bad.yaml': 'stage: sft\nmodel: [unclosed\n',
    'list.yaml': '- a\n- b\n',
    'empty.yaml': '',
    'dup.yaml': 'stage: sft\nstage: grpo\n',
  });
  t.equal(errorOf(() => loadConfig(join(dir, 'nope.yaml'))).code, 'FILE_NOT_FOUND');
  t.match(errorOf(() => loadConfig(dir)).message, 'is a folder');
  const bad = errorOf(() => loadConfig(join(dir, 'bad.yaml')));
  t.equal(bad.code, 'CONFIG_INVALID');
  t.match(bad.message, /bad\.yaml:\d+:\d+: /);
  t.match(
    errorOf(() => loadConfig(join(dir, 'list.yaml'))).message,
    'expected a mapping of sections (stage, model, lora, ...), found a list of 2',
  );
  t.match(errorOf(() => loadConfig(join(dir, 'empty.yaml'))).message, 'found null');
  t.match(errorOf(() => loadConfig(join(dir, 'dup.yaml'))).message, /dup\.yaml:2:1: .*unique/i);
});

t.test('the resolved config written into a run folder loads back identically', async (t) => {
  const dir = t.testdir();
  const c = loadConfig(join(configs, 'code-grpo.yaml'), ['optim.lr=3e-5']);
  const f = writeResolvedConfig(c, join(dir, 'run'), { file: 'configs/code-grpo.yaml', overrides: ['optim.lr=3e-5'] });
  const text = readFileSync(f, 'utf8');
  t.match(text, '# overrides: optim.lr=3e-5');
  t.match(text, 'stage: grpo');
  const back = loadConfig(f);
  t.same(back, c);
  writeFileSync(join(dir, 'again.yaml'), text);
  t.same(loadConfig(join(dir, 'again.yaml')), c, 'paths are absolute: the copy is independent of its folder');
});

t.test('what the config hands to the advantage functions and the schedule', async (t) => {
  const g: ResolvedConfig = loadConfig(join(configs, 'code-grpo.yaml'), ['algorithm.std=none', 'algorithm.std_estimator=population']);
  t.same(groupAdvantageOptions(g), {
    std: 'none',
    stdEstimator: 'population',
    eps: 1e-8,
    flatStd: 0.01,
    flatSkipBelow: -2,
    failAtOrBelow: 0,
    allFailed: 'normalize',
    zeroVariance: 'center',
    center: 0.5,
    useCorrectness: false,
  });
  const p = loadConfig(join(configs, 'search-r1-ppo.yaml'));
  t.same(ppoAdvantageOptions(p), { gamma: 1, lam: 1, klCoef: 0.001, klEstimator: 'k1', whiten: true });
  t.equal(
    ppoAdvantageOptions(loadConfig(join(configs, 'search-r1-ppo.yaml'), ['algorithm.kl_in=loss', 'algorithm.kl_estimator=k3'])).klCoef,
    0,
    'KL in the loss: none in the reward',
  );
  t.same(scheduleSpec(p), { kind: 'constant', lr: 1e-5, warmupSteps: 286, totalSteps: 1005, minRatio: 0 });
  t.equal(scheduleSpec(p, p.optim.critic_lr).lr, 1e-4);
});

t.test('the TypeScript shape and the schema name the same keys', async (t) => {
  // Each record must list every key of its interface (the compiler checks that side); the test checks
  // the schema's side.
  type Keys<T> = Record<keyof T, true>;
  const shape: { [S in keyof ResolvedConfig]: ResolvedConfig[S] extends object ? Keys<ResolvedConfig[S]> : true } = {
    stage: true,
    model: { path: true, adapter: true, dtype: true, device: true, threads: true, chat_template: true },
    lora: { r: true, alpha: true, dropout: true, rslora: true, targets: true, layers: true },
    data: {
      questions: true,
      eval_questions: true,
      corpus: true,
      index: true,
      sft: true,
      split: true,
      exclude_leaking: true,
      train_questions: true,
    },
    protocol: {
      kind: true,
      max_turns: true,
      max_turns_eval: true,
      turns_count: true,
      instruction: true,
      use_data_prompt: true,
      max_new_tokens: true,
      max_context: true,
      tool_output_chars: true,
      top_k: true,
      max_observation_tokens: true,
      system_prompt: true,
      final_turn_notice: true,
      enable_thinking: true,
      direct_instruction: true,
      prompts_from_sft: true,
      question_variable: true,
      final_answer: true,
      prefill_first: true,
      prefill_final: true,
      prefill_trained: true,
    },
    sandbox: { kind: true, timeout_s: true, memory_mb: true, workers: true, require_isolation: true, tools_module: true },
    retrieval: { kind: true, embedder: true, text: true, ef: true, k: true, url: true, timeout_s: true, retries: true },
    rollout: {
      k: true,
      batch_questions: true,
      temperature: true,
      top_p: true,
      top_k: true,
      first_turn_temperature: true,
      first_turn_top_p: true,
      dynamic_sampling: true,
      kv_cache_reuse: true,
      kv_cache_mb: true,
      engine: true,
      openai: true,
    },
    distributed: {
      nproc: true,
      nnodes: true,
      node_rank: true,
      master_addr: true,
      master_port: true,
      backend: true,
      timeout_s: true,
      python: true,
    },
    reward: { combine: true, on_failure: true, failure_value: true, parts: true, judge: true, module: true },
    algorithm: {
      kind: true,
      clip_low: true,
      clip_high: true,
      kl_coef: true,
      kl_reference: true,
      kl_in: true,
      kl_estimator: true,
      loss_norm: true,
      turn_discount: true,
      inner_epochs: true,
      entropy_coef: true,
      std: true,
      std_estimator: true,
      adv_eps: true,
      fallbacks: true,
      gamma: true,
      lam: true,
      vf_coef: true,
      critic: true,
      value_clip: true,
      whiten: true,
      loss_temperature: true,
      old_logprobs: true,
      overlong: true,
      mini_batch: true,
    },
    rft: { rounds: true, min_reward: true, epochs: true, max_per_question: true, unique: true, questions_per_round: true },
    optim: {
      lr: true,
      critic_lr: true,
      weight_decay: true,
      betas: true,
      eps: true,
      max_grad_norm: true,
      critic_max_grad_norm: true,
      schedule: true,
      warmup_steps: true,
      critic_warmup_steps: true,
      min_lr_ratio: true,
      micro_batch: true,
      gradient_checkpointing: true,
    },
    train: { epochs: true, steps: true, batch_size: true, seed: true, checkpoint_every: true, eval_every: true, save_total_limit: true },
    eval: { split: true, max_questions: true, temperature: true, top_p: true, max_new_tokens: true, table: true, pass_k: true },
    run: { dir: true, name: true },
    log: { report_to: true, mlflow_tracking_uri: true, mlflow_experiment: true },
  };
  const nested: Record<string, string[]> = {
    'data.split': Object.keys({ train_fraction: true, seed: true } satisfies Keys<ResolvedConfig['data']['split']>),
    'rollout.openai': Object.keys({
      urls: true,
      model: true,
      timeout_s: true,
      retries: true,
      concurrency: true,
      adapter_dir: true,
    } satisfies Keys<ResolvedConfig['rollout']['openai']>),
    'rollout.dynamic_sampling': Object.keys({ enabled: true, max_draws: true } satisfies Keys<
      ResolvedConfig['rollout']['dynamic_sampling']
    >),
    'algorithm.overlong': Object.keys({ filter: true, buffer: true, penalty_factor: true } satisfies Keys<
      ResolvedConfig['algorithm']['overlong']
    >),
    'algorithm.fallbacks': Object.keys({
      flat_std: true,
      flat_skip_below: true,
      fail_at_or_below: true,
      fail_by: true,
      all_failed: true,
      zero_variance: true,
      center: true,
    } satisfies Keys<ResolvedConfig['algorithm']['fallbacks']>),
  };
  const props = (s: unknown) => Object.keys(((s as { properties?: object }).properties ?? {}) as object);
  const top = CONFIG_SCHEMA.properties as Record<string, unknown>;
  t.same(props(CONFIG_SCHEMA).sort(), Object.keys(shape).sort(), 'sections');
  for (const [sec, keys] of Object.entries(shape)) if (keys !== true) t.same(props(top[sec]).sort(), Object.keys(keys).sort(), sec);
  for (const [path, keys] of Object.entries(nested)) {
    const [a, b] = path.split('.');
    t.same(props((top[a] as { properties: Record<string, unknown> }).properties[b]).sort(), [...keys].sort(), path);
  }
});
