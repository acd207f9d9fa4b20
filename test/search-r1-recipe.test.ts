// The Search-R1 recipes against Search-R1's own files (issue 34): the config values its
// ppo_trainer.yaml / train_ppo.sh / fsdp_workers.py set, the train file / test file split, the
// no-search prompt, k1 refused as a loss term, k3 clamped as verl clamps it; and, on a tiny model,
// that data.eval_questions, protocol.direct_instruction, algorithm.overlong and
// rollout.dynamic_sampling reach the run.
import t from 'tap';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { configFromObject } from '../lib/config/index.js';
import { loadConfig } from '../lib/config/load.js';
import { SEARCH_R1_DIRECT_INSTRUCTION, fillInstruction } from '../lib/episodes/prompts.js';
import { initModel } from '../lib/model/init.js';
import { evalView, questionSplits } from '../lib/train/data.js';
import { evalFromConfig, evalQuestions } from '../lib/train/evaluation.js';
import { klEstimate, tokenRewards } from '../lib/train/rl/gae.js';
import { groupPolicyGradient, pgOptionsFrom } from '../lib/train/rl/grpo.js';
import { ppoOptionsFrom, runPpo } from '../lib/train/rl/ppo.js';
import { trainFromConfig } from '../lib/train/session.js';
import { trainerOptions } from '../lib/train/stages.js';
import { repoRoot } from './helpers/shared.js';
import type { GenerateRequest, GenerateResult } from '../lib/engine/types.js';
import { EpisodeRunner } from '../lib/episodes/runner.js';
import { formatInformation, tagsProtocol } from '../lib/episodes/index.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { packagedQwen3Config, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import { episodeRunner, type Agent, type Environment } from '../lib/train/environment.js';

const configs = join(repoRoot, 'configs');
const base = { model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };

t.test(
  "configs/search-r1-ppo.yaml and search-r1-sft-ppo.yaml: Search-R1's top-p, entropy coefficient, weight decay, train/test files",
  async (t) => {
    for (const f of ['search-r1-ppo.yaml', 'search-r1-sft-ppo.yaml']) {
      const c = loadConfig(join(configs, f));
      // ppo_trainer.yaml: actor_rollout_ref.rollout.top_p 0.95, actor.entropy_coeff 0.001;
      // fsdp_workers.py: AdamW weight_decay optim_config.get('weight_decay', 1e-2).
      t.equal(c.rollout.top_p, 0.95, `${f}: rollout top-p`);
      t.equal(ppoOptionsFrom(c).entropyCoef, 0.001, `${f}: the entropy coefficient reaches PPO`);
      t.equal(trainerOptions(c, {}, null).weightDecay, 0.01, `${f}: the weight decay reaches the optimizer options`);
      // train_ppo.sh: data.train_files=$DATA_DIR/train.parquet, data.val_files=$DATA_DIR/test.parquet.
      t.equal(c.data.questions, join(repoRoot, 'data/nq_search/train.parquet'), `${f}: trains on the train file`);
      t.equal(c.data.eval_questions, join(repoRoot, 'data/nq_search/test.parquet'), `${f}: validates on the test file`);
      t.same(
        [c.eval.split, c.eval.temperature],
        ['eval', 0],
        `${f}: greedy validation (ray_trainer.py _validate do_sample False) on the eval file`,
      );
      t.equal(
        c.protocol.direct_instruction,
        SEARCH_R1_DIRECT_INSTRUCTION,
        `${f}: the no-search baseline asks with Search-R1's nq.py template`,
      );
      t.same(
        [c.algorithm.kl_in, c.algorithm.kl_estimator, c.algorithm.kl_coef],
        ['reward', 'k1', 0.001],
        `${f}: k1 in the reward (kl_ctrl.kl_coef 0.001, kl_penalty kl)`,
      );
    }
    t.equal(loadConfig(join(configs, 'search-r1-ppo.yaml')).protocol.max_turns_eval, 2, 'train_ppo.sh validates with its max_turns (2)');
    // train_ppo.sh: actor lr_warmup_steps_ratio 0.285, critic 0.015; verl: int(ratio * total_steps).
    for (const [f, steps] of [
      ['search-r1-ppo.yaml', 1005],
      ['search-r1-sft-ppo.yaml', 600],
    ] as const) {
      const c = loadConfig(join(configs, f));
      // Math.floor of the float product, as Python's int(): int(0.285 * 600) is 170.
      t.same(
        [c.train.steps, c.optim.warmup_steps, c.optim.critic_warmup_steps],
        [steps, Math.floor(0.285 * steps), Math.floor(0.015 * steps)],
        `${f}: warm-ups`,
      );
      const o = ppoOptionsFrom(c);
      t.same(
        [o.schedule.warmupSteps, o.criticSchedule?.warmupSteps, o.criticSchedule?.lr, o.criticSchedule?.kind],
        [Math.floor(0.285 * steps), Math.floor(0.015 * steps), 1e-4, 'constant'],
        `${f}: the critic's own schedule reaches PPO`,
      );
    }
    t.match(
      SEARCH_R1_DIRECT_INSTRUCTION,
      /^Answer the given question\. You should first have a reasoning process in mind and then provides the answer\. Show your reasoning in <think> <\/think> tags/,
    );
    t.equal(loadConfig(join(configs, 'search-r1-sft.yaml')).eval.split, 'all', 'the SFT config evaluates on every row of the test file');
  },
);

t.test(
  "protocol.max_observation_tokens: an <information> block keeps its first N tokens, as Search-R1's max_obs_length cuts it",
  async (t) => {
    const tok = qwen3Tokenizer();
    const formatter = new ChatFormatter(packagedQwen3Config().chat_template as string, { eosToken: '<|im_end|>' });
    const passages = [1, 2, 3].map((i) => ({ title: `Page ${i}`, text: `Passage ${i} says ${'many words here '.repeat(20)}` }));
    const search = { searchPassages: () => passages };
    const turns = ['<search> capital of France </search>', '<answer> Paris </answer>'];
    const run = async (maxObservationTokens?: number) => {
      let turn = 0;
      const generator = {
        async generate(req: GenerateRequest): Promise<GenerateResult> {
          const ids = tok.encode(turns[turn++]);
          return {
            tokens: req.prompts.map(() => Int32Array.from(ids)),
            logprobs: req.prompts.map(() => Float32Array.from(ids, () => -0.5)),
            finishReasons: req.prompts.map(() => 'stop_string' as const),
          };
        },
      };
      const runner = new EpisodeRunner({
        generator,
        tokenizer: tok,
        formatter,
        protocol: tagsProtocol({ search, topK: 3 }),
        maxTurns: 2,
        maxNewTokens: 64,
        maxTotalTokens: 4096,
        ...(maxObservationTokens ? { maxObservationTokens } : {}),
      });
      return (await runner.run([{ question: 'What is the capital of France?', temperature: 1 }])).episodes[0];
    };
    // Search-R1 (generation.py _process_next_obs): tokenizer(f'\n\n<information>{results}</information>\n\n')[:, :max_obs_length].
    const block = tok.encode(formatInformation(passages), { splitSpecialTokens: true });
    t.ok(block.length > 60, `the block is ${block.length} tokens`);
    const whole = await run();
    const cut = await run(40);
    const env = (e: Awaited<ReturnType<typeof run>>) => e.segments.filter((s) => s.source === 'env');
    t.equal(env(whole)[0].tokens, block.length, 'no cut: the whole block');
    t.equal(env(cut)[0].tokens, 40, 'cut: 40 tokens');
    t.equal(env(cut)[0].text, tok.decode(block.slice(0, 40)), 'its first 40 tokens, closing tag gone as in Search-R1');
    t.equal(cut.ids.length, whole.ids.length - (block.length - 40), 'the sequence is shorter by the cut tokens');
    t.equal(
      cut.lossMask.reduce((a, b) => a + b, 0),
      whole.lossMask.reduce((a, b) => a + b, 0),
      'the trained tokens are the same',
    );
    t.equal(cut.answer, 'Paris');
    // Plumbing: the config key reaches the runner; the code protocol refuses it; direct ignores it.
    const base = { stage: 'ppo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };
    const cfg = configFromObject({ ...base, protocol: { kind: 'tags', max_observation_tokens: 40 } });
    const agent = { model: {} as never, tokenizer: tok, formatter } as unknown as Agent;
    const envObj = { protocol: tagsProtocol({ search }), describe: '', close: async () => {} } as unknown as Environment;
    t.equal(episodeRunner(cfg, agent, envObj, { seed: 0 }).options.maxObservationTokens, 40, 'training rollouts');
    t.equal(episodeRunner(cfg, agent, envObj, { seed: 0, eval: true }).options.maxObservationTokens, 40, 'evaluation');
    t.throws(() => configFromObject({ ...base, protocol: { kind: 'code', max_observation_tokens: 40 } }), {
      code: 'CONFIG_INVALID',
      message: /tool_output_chars/,
    });
    t.equal(
      configFromObject({ ...base, protocol: { kind: 'direct', max_observation_tokens: 40 } }).protocol.max_observation_tokens,
      40,
      'direct: accepted (the search-r1 configs run it with protocol.kind=direct)',
    );
    for (const f of ['search-r1-ppo.yaml', 'search-r1-sft-ppo.yaml'])
      t.equal(loadConfig(join(configs, f)).protocol.max_observation_tokens, 500, `${f}: train_ppo.sh max_obs_length 500`);
  },
);

t.test('data.eval_questions: every row of data.questions trains, the eval file evaluates; eval.split all refused with it', async (t) => {
  const dir = t.testdir();
  const rows = (qs: string[]) => qs.map((q, i) => JSON.stringify({ id: q, question: `${q}?`, answer: String(i) })).join('\n') + '\n';
  writeFileSync(join(dir, 'train.jsonl'), rows(['a', 'b', 'c', 'd', 'e']));
  writeFileSync(join(dir, 'test.jsonl'), rows(['x', 'y']));
  const ids = (qs: Array<{ id: string }>) => qs.map((q) => q.id);
  const split = await questionSplits({
    questions: join(dir, 'train.jsonl'),
    eval_questions: join(dir, 'test.jsonl'),
    split: { train_fraction: 0.8, seed: null },
  });
  t.same(
    [ids(split.train), ids(split.eval)],
    [
      ['a', 'b', 'c', 'd', 'e'],
      ['x', 'y'],
    ],
  );
  const cut = await questionSplits({
    questions: join(dir, 'train.jsonl'),
    eval_questions: null,
    split: { train_fraction: 0.8, seed: null },
  });
  t.same([ids(cut.train), ids(cut.eval)], [['a', 'b', 'c', 'd'], ['e']], 'without it: data.split as before');
  const cfg = configFromObject({
    ...base,
    stage: 'grpo',
    data: { questions: join(dir, 'train.jsonl'), eval_questions: join(dir, 'test.jsonl'), corpus: '/c' },
  });
  t.same(
    [evalView(cfg).data.questions, evalView(cfg).eval.split],
    [join(dir, 'test.jsonl'), 'all'],
    'eval.split eval reads the eval file whole',
  );
  const onTrain = configFromObject({
    ...base,
    stage: 'grpo',
    data: { questions: join(dir, 'train.jsonl'), eval_questions: join(dir, 'test.jsonl'), corpus: '/c' },
    eval: { split: 'train' },
  });
  t.same(
    [evalView(onTrain).data.questions, evalView(onTrain).eval.split],
    [join(dir, 'train.jsonl'), 'all'],
    'eval.split train reads the train file whole',
  );
  const plain = configFromObject({ ...base, stage: 'grpo' });
  t.equal(evalView(plain), plain, 'no eval file: the config as it is');
  t.same(ids(await evalQuestions(cfg)), ['x', 'y'], 'evalFromConfig (the library, the demo) evaluates on the eval file');
  t.same(ids(await evalQuestions(onTrain)), ['a', 'b', 'c', 'd', 'e'], 'eval.split train: every row of data.questions');
  t.throws(
    () =>
      configFromObject({ ...base, stage: 'grpo', data: { questions: '/q', eval_questions: '/t', corpus: '/c' }, eval: { split: 'all' } }),
    { code: 'CONFIG_INVALID', message: /eval\.split: with data\.eval_questions a split names one file/ },
  );
});

t.test('k1 as a loss term is refused with a coded error that says why; k1 in the reward and k3 in the loss are accepted', async (t) => {
  const why = /k1 as a loss term has zero expected gradient/;
  t.throws(() => configFromObject({ ...base, stage: 'grpo', algorithm: { kl_coef: 0.01, kl_estimator: 'k1' } }), {
    code: 'CONFIG_INVALID',
    message: why,
  });
  t.throws(() => configFromObject({ ...base, stage: 'ppo', algorithm: { kl_coef: 0.01, kl_in: 'loss', kl_estimator: 'k1' } }), {
    code: 'CONFIG_INVALID',
    message: why,
  });
  t.equal(
    configFromObject({ ...base, stage: 'ppo', algorithm: { kl_coef: 0.01, kl_estimator: 'k1' } }).algorithm.kl_in,
    'reward',
    'k1 in the reward (Search-R1) is fine',
  );
  t.equal(
    configFromObject({ ...base, stage: 'grpo', algorithm: { kl_coef: 0, kl_estimator: 'k1' } }).algorithm.kl_estimator,
    'k1',
    'k1 with no KL term at all is harmless',
  );
  t.equal(
    pgOptionsFrom(configFromObject({ ...base, stage: 'grpo', algorithm: { kl_coef: 0.01 } })).klEstimator,
    'k3',
    'the loss default: k3',
  );
  // The trainers' own options refuse it too (library callers bypass the config).
  const lora = { r: 2, alpha: 4, dropout: 0, rslora: false, targets: ['q_proj' as const] };
  t.throws(
    () =>
      groupPolicyGradient('grpo', () => ({ advantages: [0] }), {
        lora,
        k: 2,
        questionsPerStep: 1,
        steps: 1,
        temperature: 1,
        seed: 0,
        schedule: { kind: 'constant', lr: 1e-3 },
        klCoef: 0.1,
        klEstimator: 'k1',
      }),
    { code: 'CONFIG_INVALID', message: why },
  );
  await t.rejects(
    runPpo(
      null as never,
      [],
      null as never,
      { rollout: null as never, reward: null as never },
      {
        lora,
        n: 1,
        questionsPerStep: 1,
        steps: 1,
        temperature: 1,
        seed: 0,
        schedule: { kind: 'constant', lr: 1e-3 },
        klCoef: 0.1,
        klIn: 'loss',
        klEstimator: 'k1',
      },
    ),
    { code: 'CONFIG_INVALID', message: why },
  );
});

t.test("k3 in the reward is clamped to [-10, 10] as verl's kl_penalty('low_var_kl') clamps it", async (t) => {
  // verl core_algos.kl_penalty, low_var_kl: kl = ref - logprob; kld = exp(kl) - kl - 1; clamp(-10, 10).
  const verl = (lp: number, ref: number) => Math.min(10, Math.max(-10, Math.exp(ref - lp) - (ref - lp) - 1));
  const pairs: Array<[number, number]> = [
    [-1.2, -1.5],
    [-0.1, -3],
    [-3, -0.1],
    [0, -15],
    [-15, 0],
    [-0.5, -0.5],
    [-20, -2],
  ];
  for (const [lp, ref] of pairs)
    t.ok(
      Math.abs(klEstimate(lp, ref, 'k3') - verl(lp, ref)) < 1e-12,
      `logp ${lp}, ref ${ref}: ${klEstimate(lp, ref, 'k3')} = ${verl(lp, ref)}`,
    );
  t.equal(klEstimate(-20, -2, 'k3'), 10, 'ref far above the policy: exp(18) - 19, clamped to 10');
  t.equal(klEstimate(0, -15, 'k3'), 10, 'policy far above the ref: exp(-15) + 14, clamped to 10');
  // And in the token rewards PPO trains on: -kl_coef * clamped k3.
  const tr = tokenRewards(
    { mask: Uint8Array.from([1, 1]), score: 1, logprobs: Float32Array.from([-20, -1.2]), refLogprobs: Float32Array.from([-2, -1.5]) },
    0.5,
    'k3',
  );
  t.ok(Math.abs(tr.rewards[0] - -5) < 1e-6, `token 0: -0.5 * 10 = ${tr.rewards[0]}`);
  t.ok(Math.abs(tr.rewards[1] - (1 - 0.5 * verl(-1.2, -1.5))) < 1e-6, 'token 1: the score minus the penalty');
});

t.test('on a tiny model: eval file, no-search prompt, over-long rules and dynamic sampling reach the run', async (t) => {
  const root = t.testdir();
  const model = initModel({ preset: 'tiny', out: join(root, 'model') }).dir;
  mkdirSync(join(root, 'modules'));
  // Questions "flat ..." score 0.5 whatever the model says (no spread); the others the reply length mod 5.
  writeFileSync(
    join(root, 'modules', 'r.mjs'),
    `export const reward = (ctx) => ctx.question.startsWith('flat') ? 0.5 : (ctx.episode?.messages?.at(-1)?.content ?? '').length % 5;\n`,
  );
  const train = ['flat one', 'Question two', 'flat three', 'Question four', 'Question five', 'flat six'];
  writeFileSync(
    join(root, 'train.jsonl'),
    train.map((q, i) => JSON.stringify({ id: `t${i}`, question: q, answer: 'x' })).join('\n') + '\n',
  );
  writeFileSync(
    join(root, 'test.jsonl'),
    ['Held out one', 'Held out two'].map((q, i) => JSON.stringify({ id: `e${i}`, question: q, answer: 'x' })).join('\n') + '\n',
  );
  const instruction = 'Think in <think> </think>, answer in <answer> </answer>. Question: {question}\\n';
  const file = join(root, 'grpo.yaml');
  writeFileSync(
    file,
    [
      'stage: grpo',
      `model: { path: ${model} }`,
      'data: { questions: train.jsonl, eval_questions: test.jsonl }',
      `protocol: { kind: direct, max_turns: 1, max_new_tokens: 6, direct_instruction: "${instruction}" }`,
      'rollout: { k: 2, batch_questions: 2, dynamic_sampling: { enabled: true, max_draws: 3 } }',
      'algorithm: { overlong: { buffer: 2, penalty_factor: 0.5 } }',
      'reward: { module: modules/r.mjs, parts: [{ kind: module }] }',
      'lora: { r: 4, alpha: 8 }',
      'optim: { lr: 0.01 }',
      'train: { steps: 2, checkpoint_every: 0, eval_every: 1 }',
      'eval: { max_questions: 2 }',
      `run: { dir: ${join(root, 'runs')} }`,
      '',
    ].join('\n'),
  );
  const cfg = loadConfig(file);
  const lines: string[] = [];
  const r = await trainFromConfig(cfg, { log: (l) => void lines.push(l) });
  const jsonl = (f: string) =>
    readFileSync(f, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
  const metrics = jsonl(join(r.dir, 'metrics.jsonl')).filter((m) => m.kind !== 'eval');
  t.equal(metrics.length, 2);
  t.ok(
    lines.some((l) => /questions: 6 to train on \(every row of .*train\.jsonl\), 2 to evaluate on \(.*test\.jsonl\)/.test(l)),
    'all six train rows train (no 80 % cut), the test file evaluates',
  );
  for (const m of metrics) {
    t.type(m.dynamic_draws, 'number', 'dynamic sampling reports its draws');
    t.ok(m.dynamic_draws >= 1 && m.dynamic_draws <= 3, `draws within max_draws: ${m.dynamic_draws}`);
    t.type(m.episodes_truncated, 'number', 'the over-long rules report what they saw');
  }
  const traj = jsonl(join(r.dir, 'trajectories.jsonl'));
  t.ok(traj.length >= 4, `groups with a spread were trained on (${traj.length} episodes)`);
  t.ok(
    traj.every((x) => !x.question.question.startsWith('flat')),
    'no flat group was trained on',
  );
  t.ok(
    traj.every((x) => train.includes(x.question.question)),
    'train episodes come from the train file',
  );
  for (const x of traj)
    t.equal(
      x.messages[0].content,
      fillInstruction(instruction.replace('\\n', '\n'), x.question.question),
      'the episode starts from protocol.direct_instruction',
    );
  // Six sampled tokens against a limit of 6 with a 2-token buffer: a reply that ran to the limit
  // scores 0.5 * 2 / 2 = 0.5 less (the filter, which would leave out nearly every episode of a random
  // model, is tested on the loop in test/dapo.test.ts).
  for (const x of traj) {
    const longest = Math.max(
      ...x.steps.map((s: { generatedTokens: number; droppedTokens: number }) => s.generatedTokens + s.droppedTokens),
    );
    const expected = longest > 4 ? (-0.5 * Math.min(longest - 4, 2)) / 2 : undefined;
    t.equal(x.parts.overlong_penalty, expected, `longest turn ${longest}: penalty ${expected}`);
  }
  const evals = readdirSync(join(r.dir, 'evals')).sort();
  t.same(evals, ['step-1', 'step-2']);
  const held = jsonl(join(r.dir, 'evals', 'step-1', 'trajectories.jsonl')).map((x) => x.question);
  t.same(held, ['Held out one', 'Held out two'], 'the evaluation during training reads data.eval_questions');
  // `slm-train eval` reads the config through evalView (lib/cli/train.ts).
  const ev = await evalFromConfig(evalView(cfg), { adapter: r.adapter, label: 'after' });
  t.equal(ev.summary.questions, 2);
  t.same(
    jsonl(join(ev.dir, 'trajectories.jsonl')).map((x) => x.question),
    ['Held out one', 'Held out two'],
  );
});
