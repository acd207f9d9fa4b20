// The reference code-search system's recipe as configs/code-grpo.yaml and configs/code-eval.yaml set
// it (issue 34), each value computed here from the reference's own code and settings
// (Aatamte/DataMiningFinalProject: src/agent/agent.py, src/trainer/core.py, src/trainer/episode.py,
// src/prompts/judge.py, configs/rl.yaml, configs/eval.yaml):
// - the forced protocol in training: turn 1 starts with <python>, the last turn with <answer>; the
//   tokens trained are the reference's response tokens (prefill included) and the program that ran
//   is the prefilled block's; evaluation does not prefill;
// - turn 1 sampled at the middles of the ranges (0.925, 0.92), the per-rollout draws afterwards;
// - the judge: "(no answer)" asked about and scored -(1 - approach), its reply budget, a verdict
//   without approach_score;
// - old log-probs: recomputed by the trained policy (and the prefilled tokens' filled in) through
//   the trainers' rollout function;
// - the config keys' bad values refused with coded errors.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../lib/config/load.js';
import { validateConfig } from '../lib/config/load.js';
import type { GenerateRequest, GenerateResult, TextGenerator } from '../lib/engine/types.js';
import type { Model } from '../lib/engine/model.js';
import { codeProtocol, EpisodeRunner, type CodeExecutor, type Episode, type ProgramResult } from '../lib/episodes/index.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { packagedQwen3Config, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import type { ChatMessage } from '../lib/model/tokenizer-types.js';
import { judgeReward, type JudgeBackend, type RewardContext } from '../lib/rewards/index.js';
import { rewardFromConfig } from '../lib/rewards/combine.js';
import { episodeRunner, trainingTurns, type Agent, type Environment } from '../lib/train/environment.js';
import { withOldLogprobs } from '../lib/train/rl/old-logprobs.js';
import { rolloutFn } from '../lib/train/stages.js';
import type { TrainEpisode } from '../lib/train/types.js';
import { fixture, haveShared } from './helpers/shared.js';
import { fakeTrainStats } from './helpers/train-stats.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tok = qwen3Tokenizer();
const IM_END = '<|im_end|>';
const template = haveShared
  ? readFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), 'utf8')
  : (packagedQwen3Config().chat_template as string);
const formatter = new ChatFormatter(template, { eosToken: IM_END });
const lp = (id: number) => Math.fround(-(1 + (id % 997)) / 1000);

// The reference's numbers, as its files state them.
const RL = { temperature_min: 0.7, temperature_max: 1.15, top_p_min: 0.85, top_p_max: 0.99, judge_max_tokens: 1600 }; // configs/rl.yaml 20-24, 56
const EVAL = { temperature: 0.7, max_new_tokens: 512, top_p: 0.95 }; // configs/eval.yaml 18-19, agent.py 43

/** Plays scripted turns (the text after any prefill); a prompt that is not the last call's prompt + output starts the next turn. */
class Scripted implements TextGenerator {
  calls: Array<{ temperature: number[]; topP: number | number[] | undefined; prompts: string[] }> = [];
  readonly #state = new Map<string, { turn: number; lastLen: number; pos: number }>();
  constructor(readonly scripts: Record<string, string[]>) {}
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const out: GenerateResult = { tokens: [], logprobs: [], finishReasons: [] };
    for (const p of req.prompts) {
      const text = tok.decode(Array.from(p));
      const key = Object.keys(this.scripts).find((k) => text.includes(k))!;
      const st = this.#state.get(key) ?? { turn: -1, lastLen: -1, pos: 0 };
      if (p.length !== st.lastLen) {
        st.turn++;
        st.pos = 0;
      }
      const all = tok.encode(this.scripts[key][st.turn]);
      const got: number[] = [];
      let finish: 'stop_string' | 'stop_token' | 'length' = 'length';
      while (st.pos < all.length && got.length < req.maxNewTokens) {
        got.push(all[st.pos++]);
        if (req.stopTokenIds?.includes(got[got.length - 1])) {
          finish = 'stop_token';
          break;
        }
        if (req.stopStrings?.some((s) => tok.decode(got).includes(s))) {
          finish = 'stop_string';
          break;
        }
      }
      st.lastLen = p.length + got.length;
      this.#state.set(key, st);
      out.tokens.push(Int32Array.from(got));
      out.logprobs.push(Float32Array.from(got, lp));
      out.finishReasons.push(finish);
    }
    const temps =
      typeof req.temperature === 'number' ? req.prompts.map(() => req.temperature as number) : Array.from(req.temperature ?? []);
    this.calls.push({ temperature: temps, topP: req.topP, prompts: req.prompts.map((p) => tok.decode(Array.from(p))) });
    return out;
  }
}

class Exec implements CodeExecutor {
  programs: string[] = [];
  async run(code: string): Promise<ProgramResult> {
    this.programs.push(code);
    return { stdout: 'found: Paris\n', error: null, timed_out: false, calls: [], truncated: false, duration_ms: 1 };
  }
}

const SYSTEM = 'You answer questions by writing Python.';
const NOTICE = '[FINAL TURN] Answer now.';
const protocol = (exec: CodeExecutor) => codeProtocol({ executor: exec, systemPrompt: SYSTEM, finalTurnNotice: NOTICE });

t.test('the code recipe configs hold the reference values', async (t) => {
  const g = loadConfig(join(root, 'configs', 'code-grpo.yaml'));
  t.equal(g.protocol.prefill_first, '<python>', 'agent.py 520: run_batch_turn1 prefill="<python>"');
  t.equal(g.protocol.prefill_final, '<answer>', 'agent.py 613: the final turn prefill="<answer>"');
  t.equal(g.protocol.prefill_trained, true, 'episode.py 55: the response text (prefill included) is trained');
  // (Python's (0.7 + 1.15) / 2 is 0.9249999999999999; the config writes 0.925.)
  t.ok(Math.abs(g.rollout.first_turn_temperature! - (RL.temperature_min + RL.temperature_max) / 2) < 1e-12, 'core.py 627: avg_temp');
  t.ok(Math.abs(g.rollout.first_turn_top_p! - (RL.top_p_min + RL.top_p_max) / 2) < 1e-12, 'core.py 628: avg_top_p');
  t.same(g.rollout.temperature, [RL.temperature_min, RL.temperature_max]);
  t.same(g.rollout.top_p, [RL.top_p_min, RL.top_p_max]);
  const j = g.reward.judge as Record<string, unknown>;
  t.equal(j.max_tokens, RL.judge_max_tokens, 'rl.yaml 56');
  t.equal(j.skip_without_answer, false, 'core.py 841: "(no answer)" is judged');
  t.equal(j.missing_approach, 'error', 'judge.py 22: approach_score is required, so a reply without it fails (-1)');
  t.equal(g.algorithm.old_logprobs, 'forward', 'episode.py 510-530: no ratio, the NLL of the training forward (LoRA dropout on)');
  t.equal(g.algorithm.loss_temperature, 1, 'episode.py 510: the NLL of the plain logits');
  t.equal(g.data.train_questions, 300, 'rl.yaml 11: num_samples 300');
  // episode.py 341-343: a flat group (std < 0.01) trains on r - 0.5 whatever its mean: no reward is below flat_skip_below.
  t.equal(g.algorithm.fallbacks.flat_std, 0.01);
  t.ok(g.algorithm.fallbacks.flat_skip_below < -1.5, 'no flat group skipped');
  t.equal(g.algorithm.fallbacks.center, 0.5);
  for (const c of [g, loadConfig(join(root, 'configs', 'code-sft.yaml')), loadConfig(join(root, 'configs', 'code-eval.yaml'))]) {
    t.equal(c.eval.temperature, EVAL.temperature, `${c.run.name}: eval temperature`);
    t.equal(c.eval.top_p, EVAL.top_p, `${c.run.name}: eval top-p`);
    t.equal(c.eval.max_new_tokens, EVAL.max_new_tokens, `${c.run.name}: eval tokens per turn`);
    t.equal(c.retrieval.k, 5, `${c.run.name}: search_pages returns 5 pages (docker/server.py 63)`);
  }
  const e = loadConfig(join(root, 'configs', 'code-eval.yaml'));
  t.equal(e.stage, 'eval');
  t.equal(e.protocol.max_turns, 2, 'eval.yaml 17');
  t.equal(e.data.split.train_fraction, 0.8, 'core.py 6: the last 20 % evaluated');
});

t.test('bad values of the new keys are coded config errors', async (t) => {
  const base = { stage: 'grpo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };
  const bad = (patch: Record<string, unknown>, path: string) => {
    let err: unknown;
    try {
      validateConfig({ ...base, ...patch }, 'x');
    } catch (e) {
      err = e;
    }
    t.equal((err as { code?: string })?.code, 'CONFIG_INVALID', `${path}: CONFIG_INVALID`);
    t.match((err as Error)?.message ?? '', path, `${path}: named`);
    return (err as Error)?.message ?? '';
  };
  bad({ protocol: { prefill_trained: 'yes' } }, 'protocol.prefill_trained');
  bad({ protocol: { prefill_first: 3 } }, 'protocol.prefill_first');
  bad({ rollout: { first_turn_temperature: -1 } }, 'rollout.first_turn_temperature');
  bad(
    { rollout: { first_turn_temperature: 0.9, first_turn_top_p: 1.5 }, algorithm: { old_logprobs: 'recompute' } },
    'rollout.first_turn_top_p',
  );
  bad({ algorithm: { old_logprobs: 'fresh' } }, 'algorithm.old_logprobs');
  bad({ algorithm: { loss_temperature: 0, old_logprobs: 'recompute' } }, 'algorithm.loss_temperature');
  t.match(bad({ algorithm: { loss_temperature: 1 } }, 'algorithm.loss_temperature'), 'algorithm.old_logprobs: recompute');
  bad({ eval: { max_new_tokens: 0 } }, 'eval.max_new_tokens');
  t.match(bad({ rollout: { first_turn_temperature: 0.925 } }, 'rollout.first_turn_temperature'), 'algorithm.old_logprobs: recompute');
  bad({ rollout: { first_turn_top_p: 0.92 }, algorithm: { old_logprobs: 'recompute' } }, 'rollout.first_turn_top_p');
  t.doesNotThrow(() =>
    validateConfig(
      { ...base, rollout: { first_turn_temperature: 0.925, first_turn_top_p: 0.92 }, algorithm: { old_logprobs: 'recompute' } },
      'x',
    ),
  );
  t.throws(
    () =>
      rewardFromConfig({
        combine: 'sign_magnitude',
        parts: [{ kind: 'judge_correctness' }, { kind: 'judge_approach' }],
        judge: { base_url: 'http://127.0.0.1:1', model: 'm', missing_approach: 'maybe' },
      } as never),
    { code: 'CONFIG_INVALID' },
  );
  t.throws(
    () =>
      new EpisodeRunner({
        generator: new Scripted({}),
        tokenizer: tok,
        formatter,
        protocol: protocol(new Exec()),
        maxTurns: 2,
        maxNewTokens: 8,
        maxTotalTokens: 99,
        prefill: { first: '' },
      }),
    { code: 'ARGUMENT_INVALID' },
  );
  t.throws(
    () =>
      new EpisodeRunner({
        generator: new Scripted({}),
        tokenizer: tok,
        formatter,
        protocol: protocol(new Exec()),
        maxTurns: 2,
        maxNewTokens: 8,
        maxTotalTokens: 99,
        firstTurn: { temperature: 0.9, topP: 0 },
      }),
    { code: 'ARGUMENT_INVALID' },
  );
});

/** The reference's trained text of turn j (episode.py trajectory(): the chat template of the messages before it, then the response). */
function referenceTurns(messages: ChatMessage[]): Array<{ prompt: string; response: string }> {
  const out: Array<{ prompt: string; response: string }> = [];
  messages.forEach((m, i) => {
    if (m.role === 'assistant') out.push({ prompt: formatter.prompt(messages.slice(0, i)), response: m.content });
  });
  return out;
}

const grpo = () => loadConfig(join(root, 'configs', 'code-grpo.yaml'));
const agentOf = (gen: TextGenerator): Agent => ({ model: gen as unknown as Model, tokenizer: tok, formatter });
const envOf = (exec: CodeExecutor): Environment => ({ protocol: protocol(exec), describe: 'test', close: async () => {} });

t.test('forced protocol: the tokens trained and the observation (code-grpo.yaml through episodeRunner)', async (t) => {
  const cfg = grpo();
  const gen = new Scripted({
    'capital of France': ['\nprint(search_pages("France capital"))\n</python>' + IM_END, 'Paris</answer>' + IM_END],
  });
  const exec = new Exec();
  const runner = episodeRunner(cfg, agentOf(gen), envOf(exec), { seed: 1, generator: gen });
  t.same(runner.options.prefill, { first: '<python>', final: '<answer>', trained: true }, 'the config reached the runner');
  const [e] = (await runner.run([{ question: 'What is the capital of France?', temperature: 1.1, topP: 0.9 }])).episodes;
  // The observation: the program of the prefilled block ran, its output came back.
  t.same(exec.programs, ['print(search_pages("France capital"))'], 'the program inside the prefilled <python> ran');
  t.equal(e.answer, 'Paris');
  t.equal(e.finish, 'answer');
  const asst = e.messages.filter((m) => m.role === 'assistant').map((m) => m.content);
  t.same(
    asst,
    ['<python>\nprint(search_pages("France capital"))\n</python>', '<answer>Paris</answer>'],
    'messages hold the prefill as the reference responses do',
  );
  t.ok(
    e.messages.some((m) => m.role === 'user' && m.content === '<python_output>\nfound: Paris\n\n</python_output>'),
    'the observation',
  );
  // The model saw the prefill before generating: the turn's first call's prompt ends with it.
  t.ok(gen.calls[0].prompts[0].endsWith('<|im_start|>assistant\n<python>'), 'turn 1 generated after <python>');
  t.ok(gen.calls[1].prompts[0].endsWith(`${NOTICE}<|im_end|>\n<|im_start|>assistant\n<answer>`), 'the last turn generated after <answer>');
  // The tokens trained, against the reference's. Its sampling prompt of turn j is
  // tokenizer(chat_template(messages before it) + prefill) (agent.py 233-242) and its trained text the
  // response, prefill included (episode.py 44-55, 464-507). (Its loss re-tokenizes prompt + response:
  // `<python>` + a sampled "\n" then become one token `>\n`; the sequence here keeps the sampled tokens.)
  const ref = referenceTurns(e.messages);
  t.equal(ref.length, 2);
  const ids = Array.from(e.ids);
  const starts: number[] = [];
  let at = 0;
  for (const sg of e.segments) {
    if (sg.source === 'prefill') starts.push(at);
    at += sg.tokens;
  }
  t.equal(starts.length, 2, 'two prefilled turns');
  for (const [j, r] of ref.entries()) {
    const k = starts[j];
    const pre = tok.encode(j === 0 ? '<python>' : '<answer>');
    t.equal(tok.decode(ids.slice(0, k)), r.prompt, `turn ${j + 1}: what comes before it is the reference's prompt`);
    t.same(
      tok.encode(r.prompt + (j === 0 ? '<python>' : '<answer>')).slice(-pre.length),
      pre,
      `turn ${j + 1}: the reference's tokenizer(prompt + prefill) ends with the prefill's tokens`,
    );
    t.same(ids.slice(k, k + pre.length), pre, `turn ${j + 1}: starts with the prefill's tokens`);
    let end = k;
    while (end < ids.length && e.lossMask[end] === 1) end++;
    // (Generation stops at the closing tag, as the reference cuts its text there: agent.py 130-132.)
    t.equal(tok.decode(ids.slice(k, end)), r.response, `turn ${j + 1}: the trained tokens are the reference's response`);
    t.equal(end - k, pre.length + e.steps[j].generatedTokens, `turn ${j + 1}: prefill + sampled tokens, all trained`);
    t.same(
      Array.from(e.lossMask.subarray(0, k)).filter((x) => x === 1).length,
      ref.slice(0, j).reduce((n, _x, i) => n + tok.encode(i === 0 ? '<python>' : '<answer>').length + e.steps[i].generatedTokens, 0),
      `turn ${j + 1}: nothing before it trained but the earlier turns`,
    );
    t.same(
      Array.from(e.forced!.subarray(k, k + pre.length)),
      pre.map(() => 1),
      'marked forced',
    );
    t.same(
      Array.from(e.logprobs.subarray(k, k + pre.length)),
      pre.map(() => 0),
      'no sampler log-prob for them',
    );
    t.equal(e.logprobs[k + pre.length], lp(ids[k + pre.length]), 'the first sampled token keeps its log-prob');
  }
  t.equal(
    e.forced!.reduce((a, b) => a + b, 0),
    tok.encode('<python>').length + tok.encode('<answer>').length,
    'only the prefills are forced',
  );
  t.same(
    e.steps.map((s) => s.prefillTokens),
    [tok.encode('<python>').length, tok.encode('<answer>').length],
  );
});

t.test('prefill_trained false: in the sequence, out of the loss', async (t) => {
  const gen = new Scripted({ 'Who?': ['x = 1\nprint(x)\n</python>' + IM_END, 'Bob</answer>' + IM_END] });
  const runner = new EpisodeRunner({
    generator: gen,
    tokenizer: tok,
    formatter,
    protocol: protocol(new Exec()),
    maxTurns: 2,
    maxNewTokens: 64,
    maxTotalTokens: 4096,
    prefill: { first: '<python>', final: '<answer>' },
  });
  const [e] = (await runner.run([{ question: 'Who?' }])).episodes;
  const forced = Array.from(e.forced!)
    .map((f, k) => (f ? k : -1))
    .filter((k) => k >= 0);
  t.equal(forced.length, tok.encode('<python>').length + tok.encode('<answer>').length);
  t.same(
    forced.map((k) => e.lossMask[k]),
    forced.map(() => 0),
    'prefilled tokens not trained',
  );
  t.equal(e.answer, 'Bob');
});

t.test('a prefill that does not fit ends the episode with context', async (t) => {
  const gen = new Scripted({ 'Who?': ['x</python>'] });
  const p = formatter.prompt([
    { role: 'system', content: SYSTEM },
    { role: 'user', content: 'Question: Who?' },
  ]);
  const n = tok.encode(p).length;
  const runner = new EpisodeRunner({
    generator: gen,
    tokenizer: tok,
    formatter,
    protocol: protocol(new Exec()),
    maxTurns: 2,
    maxNewTokens: 64,
    maxTotalTokens: n + 1,
    prefill: { first: '<python>' },
  });
  const [e] = (await runner.run([{ question: 'Who?' }])).episodes;
  t.equal(e.finish, 'context');
  t.equal(e.ids.length, n, 'nothing appended');
  t.equal(gen.calls.length, 0, 'no generate call');
});

t.test("turn 1 at the ranges' middles, the per-rollout draws afterwards; evaluation has neither", async (t) => {
  const cfg = grpo();
  const scripts: Record<string, string[]> = {
    'Q one': ['print(1)\n</python>', 'A</answer>'],
    'Q two': ['print(2)\n</python>', 'B</answer>'],
  };
  const gen = new Scripted(scripts);
  t.same(trainingTurns(cfg).firstTurn, { temperature: 0.925, topP: 0.92 });
  const runner = episodeRunner(cfg, agentOf(gen), envOf(new Exec()), { seed: 3, generator: gen });
  const eps = (
    await runner.run([
      { question: 'Q one', temperature: 0.71, topP: 0.86 },
      { question: 'Q two', temperature: 1.14, topP: 0.98 },
    ])
  ).episodes;
  t.equal(gen.calls.length, 2);
  const near = (x: unknown, y: number) => typeof x === 'number' && Math.abs(x - y) < 1e-12;
  t.ok(
    gen.calls[0].temperature.length === 2 && gen.calls[0].temperature.every((x) => near(x, (RL.temperature_min + RL.temperature_max) / 2)),
    'turn 1: every rollout at avg_temp',
  );
  t.ok(near(gen.calls[0].topP, (RL.top_p_min + RL.top_p_max) / 2), 'turn 1: avg_top_p');
  t.same(gen.calls[1].temperature, [0.71, 1.14], 'turn 2: each rollout its own draw');
  t.same(gen.calls[1].topP, [0.86, 0.98]);
  t.same(
    eps.map((e) => e.temperature),
    [0.71, 1.14],
    "the episode's temperature stays its own draw",
  );
  // Evaluation: no prefill, no fixed turn 1, the eval settings.
  const ev = episodeRunner(cfg, agentOf(gen), envOf(new Exec()), {
    eval: true,
    seed: 3,
    temperature: cfg.eval.temperature,
    generator: gen,
  });
  t.equal(ev.options.prefill, undefined);
  t.equal(ev.options.firstTurn, undefined);
  t.equal(ev.options.maxNewTokens, EVAL.max_new_tokens);
  t.equal(ev.options.topP, EVAL.top_p);
  t.equal(ev.options.temperature, EVAL.temperature);
});

/** A judge backend that answers with `reply` and records what it was asked. */
function backend(reply: string): JudgeBackend & { asked: string[] } {
  const asked: string[] = [];
  return {
    description: 'fake',
    asked,
    complete: async (ms) => (asked.push(ms.map((m) => m.content).join('\n')), { text: reply, truncated: false }),
  };
}
const ctx = (answer: string | null): RewardContext => ({
  question: 'What is the capital of France?',
  golds: ['Paris'],
  answer,
  episode: { turns: 2, messages: [{ role: 'assistant', content: '<python>\nx\n</python>' }] },
});
/** The reference's reward (core.py 852-862, use_approach_magnitude true). */
const refReward = (correct: boolean, answered: boolean, approach: number) => (correct && answered ? approach / 100 : -(1 - approach / 100));

t.test('no answer: judged, never correct, -(1 - approach)', async (t) => {
  for (const [cat, a] of [
    ['correct', 30],
    ['incorrect', 70],
    ['gave_up', 0],
  ] as const) {
    const b = backend(`<think>hm</think>{"category": "${cat}", "approach_score": ${a}}`);
    const fn = rewardFromConfig(
      {
        combine: 'sign_magnitude',
        parts: [{ kind: 'judge_correctness' }, { kind: 'judge_approach' }],
        judge: { skip_without_answer: false },
      } as never,
      { judgeBackend: b },
    );
    const r = await fn(ctx(null));
    t.equal(b.asked.length, 1, `${cat}: the judge was asked`);
    t.match(b.asked[0], /Final answer: \(none/, 'about an episode without an answer');
    t.equal(r.total, refReward(cat === 'correct', false, a) + 0, `${cat} ${a}: ${refReward(cat === 'correct', false, a)}`);
    t.equal(r.correct, false);
  }
  // The default (skip): -1 without asking, as the reference's evaluation counts it wrong without a call.
  const b = backend('{"category": "correct", "approach_score": 90}');
  const r = await rewardFromConfig(
    { combine: 'sign_magnitude', parts: [{ kind: 'judge_correctness' }, { kind: 'judge_approach' }] } as never,
    { judgeBackend: b },
  )(ctx(null));
  t.equal(b.asked.length, 0);
  t.equal(r.total, -1);
});

t.test('a verdict without approach_score: a failed call (the recipe) or approach 0', async (t) => {
  const parts = [{ kind: 'judge_correctness' }, { kind: 'judge_approach' }];
  const err = await rewardFromConfig({ combine: 'sign_magnitude', parts, judge: {} } as never, {
    judgeBackend: backend('{"category": "correct"}'),
  })(ctx('Lyon'));
  t.equal(err.total, -1, "error: the reference recipe's except branch, reward -1.0 (episode.py 313-314)");
  t.equal(err.failed, true);
  const zero = await rewardFromConfig({ combine: 'sign_magnitude', parts, judge: { missing_approach: 'zero' } } as never, {
    judgeBackend: backend('{"category": "correct"}'),
  })(ctx('Lyon'));
  t.equal(zero.total, refReward(true, true, 0), 'zero: approach 0 (judge.py 207-208), correct scores +0');
  const wrong = await judgeReward({ backend: backend('{"category": "incorrect"}'), combine: 'sign_magnitude', missingApproach: 'zero' })(
    ctx('Lyon'),
  );
  t.equal(wrong.parts.judge, refReward(false, true, 0));
  t.throws(() => judgeReward({ backend: backend(''), missingApproach: 'sometimes' as never }), { code: 'ARGUMENT_INVALID' });
});

/** A fake model: sequenceLogprobs returns -(t + 1) / 100 at scored positions, records its calls. */
function scorer() {
  const calls: Array<{ temps: number[]; masks: number[][] }> = [];
  const model = {
    calls,
    async sequenceLogprobs(rows: ArrayLike<number>[], temps: ArrayLike<number>, masks: ArrayLike<number>[]) {
      calls.push({ temps: Array.from(temps), masks: masks.map((m) => Array.from(m)) });
      return rows.map((r, i) => Float32Array.from({ length: r.length }, (_, t) => (masks[i][t] ? -(t + 1) / 100 : 0)));
    },
  };
  return model;
}

t.test("old log-probs: the sampler's with the prefilled ones filled in, or all recomputed", async (t) => {
  const ep: TrainEpisode = {
    ids: Int32Array.from([5, 6, 7, 8, 9, 10]),
    lossMask: Uint8Array.from([0, 1, 1, 1, 0, 1]),
    logprobs: Float32Array.from([0, 0, -0.5, -0.25, 0, -0.125]),
    forced: Uint8Array.from([0, 1, 0, 0, 0, 0]),
    temperature: 0.8,
    answer: 'x',
    turns: 1,
  };
  const plain: TrainEpisode = { ...ep, forced: undefined };
  const m = scorer();
  const [s, p] = await withOldLogprobs(m as unknown as Model, [ep, plain], 'sampler');
  t.same(Array.from(s.logprobs), [0, -0.02, -0.5, -0.25, 0, -0.125].map(Math.fround), 'only the trained prefilled token scored');
  t.equal(p, plain, 'an episode without prefilled tokens is left as it is');
  t.same(m.calls, [{ temps: [0.8], masks: [[0, 1, 0, 0, 0, 0]] }]);
  const [r] = await withOldLogprobs(m as unknown as Model, [ep], 'recompute');
  t.same(Array.from(r.logprobs), [0, -0.02, -0.03, -0.04, 0, -0.06].map(Math.fround), 'every trained token from the policy');
  t.same(m.calls[1], { temps: [0.8], masks: [[0, 1, 1, 1, 0, 1]] }, "at the episode's temperature, the loss mask as the scoring mask");
  t.same(await withOldLogprobs(m as unknown as Model, [], 'recompute'), []);
});

t.test("the trainers' rollouts carry the recomputed old log-probs (code-grpo.yaml with old_logprobs: recompute, rolloutFn)", async (t) => {
  const recipe = grpo();
  const cfg = { ...recipe, algorithm: { ...recipe.algorithm, old_logprobs: 'recompute' as const } };
  const gen = new Scripted({ 'Q three': ['print(3)\n</python>' + IM_END, 'C</answer>' + IM_END] });
  const m = scorer();
  const model = Object.assign(gen, { sequenceLogprobs: m.sequenceLogprobs });
  const roll = rolloutFn(cfg, agentOf(model), envOf(new Exec()));
  const [e] = await roll([
    { question: { id: '1', index: 0, question: 'Q three', golds: ['C'] } as never, temperature: 1.05, topP: 0.9, seed: 7 },
  ]);
  t.equal(m.calls.length, 1, 'one scoring forward');
  t.same(m.calls[0].temps, [1], 'at algorithm.loss_temperature (1), not the sampling temperature');
  t.equal(e.temperature, 1.05, 'the episode keeps its sampling temperature');
  t.equal(e.lossTemperature, 1);
  let checked = 0;
  e.lossMask.forEach((x, k) => {
    if (!x) return;
    checked++;
    t.equal(e.logprobs[k], Math.fround(-(k + 1) / 100), `token ${k}: recomputed`);
  });
  t.ok(checked > 4);
  t.ok(
    e.forced?.some((f, k) => f === 1 && e.lossMask[k] === 1),
    'its prefilled tokens are trained and carried',
  );
  // The recipe's own setting (forward): the training forward scores the episode itself, so no scoring forward here.
  const m2 = scorer();
  const gen2 = new Scripted({ 'Q three': ['print(3)\n</python>' + IM_END, 'C</answer>' + IM_END] });
  const [e2] = await rolloutFn(
    recipe,
    agentOf(Object.assign(gen2, { sequenceLogprobs: m2.sequenceLogprobs })),
    envOf(new Exec()),
  )([{ question: { id: '1', index: 0, question: 'Q three', golds: ['C'] } as never, temperature: 1.05, topP: 0.9, seed: 7 }]);
  t.equal(m2.calls.length, 0, 'old_logprobs: forward runs no scoring forward before the update');
  t.equal(e2.lossTemperature, 1, 'the training forward still scores at loss_temperature');
});

t.test('an Episode without prefill has no forced mask', async (t) => {
  const gen = new Scripted({ 'Who?': ['<answer>Bob</answer>'] });
  const runner = new EpisodeRunner({
    generator: gen,
    tokenizer: tok,
    formatter,
    protocol: protocol(new Exec()),
    maxTurns: 2,
    maxNewTokens: 64,
    maxTotalTokens: 4096,
  });
  const [e]: Episode[] = (await runner.run([{ question: 'Who?' }])).episodes;
  t.equal(e.forced, undefined);
  t.equal(e.answer, 'Bob');
});

t.test(
  "native: recomputed old log-probs make the first ratio 1 (lora.dropout 0), the sampler's of a turn at another temperature do not",
  async (t) => {
    const { Model: M } = await import('../lib/engine/model.js');
    const { initModel } = await import('../lib/model/init.js');
    const dir = t.testdir();
    initModel({ preset: 'tiny', out: join(dir, 'model'), seed: 4, overrides: { vocab_size: 64 }, embedStd: 0.08 });
    const m = await M.load(join(dir, 'model'));
    t.teardown(() => m.dispose());
    const targets = ['q_proj', 'k_proj', 'v_proj', 'o_proj'] as const;
    m.attachLora({ r: 8, alpha: 16, dropout: 0, rslora: false, targets: [...targets] }, 2);
    // Two turns: prompt (3), turn 1 (4 tokens, "sampled at 0.925"), reply (2), turn 2 (3 tokens, at 1.1).
    const ids = Int32Array.from([3, 9, 12, 20, 21, 22, 23, 5, 6, 30, 31, 32]);
    const mask = Uint8Array.from([0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1]);
    const turn1 = Uint8Array.from([0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
    const T = 1.1;
    const [at1] = await m.sequenceLogprobs([ids], 0.925, [turn1]);
    const [atT] = await m.sequenceLogprobs([ids], T, [mask]);
    const sampler = Float32Array.from(atT, (x, k) => (turn1[k] ? at1[k] : x));
    const ep: TrainEpisode = { ids, lossMask: mask, logprobs: sampler, temperature: T, answer: 'x', turns: 2 };
    const step = async (e: TrainEpisode) =>
      m.trainStepLocal(
        {
          sequences: [e.ids],
          masks: [e.lossMask],
          advantages: [Float32Array.from(e.lossMask, (x) => x * 0.5)],
          oldLogprobs: [e.logprobs],
          temperature: [e.temperature],
        },
        { loss: 'pg', lr: 0, clipLow: 0.2, clipHigh: 0.2, maxGradNorm: 1, checkpoint: false, update: false, seed: 1 },
      );
    const [re] = await withOldLogprobs(m, [ep], 'recompute');
    const sRe = await step(re);
    t.equal(sRe.ratio, 1, `recompute: ratio exactly 1 (${sRe.ratio})`);
    t.equal(sRe.clipFrac, 0);
    const sSa = await step(ep);
    t.ok(
      Math.abs(sSa.ratio - 1) > 1e-3,
      `sampler's log-probs of turn 1 at 0.925: ratio ${sSa.ratio} (why rollout.first_turn_temperature needs recompute)`,
    );
    // With LoRA dropout the training forward drops what the scoring forward keeps: 1 only on average.
    m.attachLora({ r: 8, alpha: 16, dropout: 0.1, rslora: false, targets: [...targets] }, 2);
    const b = m.trainable();
    for (const [k, v] of Object.entries(b))
      if (k.includes('lora_B'))
        m.setTrainable(
          k,
          Float32Array.from(v, (_, i) => ((i % 7) - 3) * 0.05),
        );
    const [re2] = await withOldLogprobs(m, [ep], 'recompute');
    const sDo = await step(re2);
    t.ok(sDo.ratio !== 1 && Math.abs(sDo.ratio - 1) < 0.2, `dropout 0.1: ratio ${sDo.ratio}, near 1 but not 1`);
  },
);

t.test('algorithm.loss_temperature reaches the training step (GRPO) and the PPO forward', async (t) => {
  const { groupPolicyGradient, pgOptionsFrom } = await import('../lib/train/rl/grpo.js');
  const { ppoForward } = await import('../lib/train/rl/ppo-batch.js');
  const cfg = grpo();
  const seen: Array<{ temperature?: number[] }> = [];
  const stats = fakeTrainStats();

  const model = { trainStep: async (b: { temperature?: number[] }) => (seen.push(b), stats) } as unknown as Model;
  const algo = groupPolicyGradient('grpo', () => ({ advantages: [1, -1] }), {
    ...pgOptionsFrom(cfg),
    lora: { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj'] },
    questionsPerStep: 1,
    steps: 1,
    temperature: 1,
    seed: 1,
  });
  const ep = (temperature: number, lossTemperature?: number) => ({
    ids: Int32Array.from([1, 2, 3]),
    lossMask: Uint8Array.from([0, 1, 1]),
    logprobs: Float32Array.from([0, -1, -1]),
    temperature,
    ...(lossTemperature ? { lossTemperature } : {}),
    answer: null,
    turns: 1,
    record: {},
  });
  await algo.update(
    { model, step: 0, requests: [], episodes: [ep(0.8, 1), ep(1.1)] as never, rewards: [{ total: 1 }, { total: 0 }] as never, offset: 0 },
    { adv: [1, -1], keep: [0, 1], skipped: [] },
  );
  t.same(seen[0].temperature, [1, 1.1], 'GRPO: lossTemperature where set, else the sampling temperature');
  const temps: number[][] = [];
  const pm = {
    sequenceLogprobs: async (rows: ArrayLike<number>[], tt: number[]) => (
      temps.push(Array.from(tt)), rows.map((r) => new Float32Array(r.length))
    ),
    values: async (rows: ArrayLike<number>[]) => rows.map((r) => new Float32Array(r.length)),
  } as unknown as Model;
  const f = await ppoForward(pm, [ep(0.8, 1) as never, ep(1.1) as never], {
    recomputeOldLogprobs: true,
    klCoef: 0,
    klIn: 'reward',
  } as never);
  t.same(f.temperature, [1, 1.1], 'PPO: its batch temperature');
  t.same(temps[0], [1, 1.1], 'PPO: its own recomputation too');
});

// The reference's JUDGE_PROMPT_TEMPLATE (src/prompts/judge.py 65-95), copied here as its file has it,
// and its JUDGE_SCHEMA as Python's json.dumps(indent=2) prints it.
const REF_TEMPLATE =
  'Evaluate the agent\'s answer AND search approach.\n\nQuestion: {question}\nGround truth answer: {answer}\nAgent\'s final answer: {response}\n\nAgent\'s full trajectory:\n{trajectory}\n\nSCORING:\n\n1. "category" (one of: "correct", "incorrect", "gave_up"):\n   - "correct": Answer is semantically equivalent to "{answer}" (same meaning, different wording OK)\n     Examples: "42 years old" matches "42", "NYC" matches "New York City"\n   - "incorrect": Agent provided a WRONG answer (tried but got it wrong)\n   - "gave_up": Agent gave up without providing a real answer\n     Examples: "Unknown", "Not found", "N/A", "Unable to determine", "I don\'t know"\n\n   IMPORTANT: "gave_up" is WORSE than "incorrect" - always penalize giving up!\n\n2. "approach_score" (0-100):\n   - 0-25: Relevant search queries (targeted vs generic)\n   - 0-25: Efficiency (minimal wasted turns, no repeated failures)\n   - 0-25: Found and read appropriate sources\n   - 0-25: Clear reasoning, answer derived from evidence\n\nThink briefly, then output JSON.\n\n{schema}\n\nJSON:';
const REF_SCHEMA =
  '{\n  "type": "object",\n  "properties": {\n    "category": {\n      "type": "string",\n      "enum": [\n        "correct",\n        "incorrect",\n        "gave_up"\n      ],\n      "description": "Classification of the response"\n    },\n    "approach_score": {\n      "type": "integer",\n      "minimum": 0,\n      "maximum": 100,\n      "description": "Quality of the search approach (0-100)"\n    }\n  },\n  "required": [\n    "category",\n    "approach_score"\n  ]\n}';
/** Python's str.format of the template (no escaped braces in it). */
const pyFormat = (tpl: string, v: Record<string, string>) =>
  tpl
    .split(/(\{\w+\})/)
    .map((p) => (/^\{\w+\}$/.test(p) ? v[p.slice(1, -1)] : p))
    .join('');

t.test("judge.prompt: reference sends the reference's prompt, filled as build_judge_prompt fills it", async (t) => {
  const { REFERENCE_JUDGE_TEMPLATE, referenceJudgeMessage } = await import('../lib/rewards/index.js');
  t.equal(REFERENCE_JUDGE_TEMPLATE, REF_TEMPLATE, 'the template word for word');
  const g = grpo();
  t.equal((g.reward.judge as Record<string, unknown>).prompt, 'reference', 'code-grpo.yaml');
  t.equal(
    (loadConfig(join(root, 'configs', 'code-eval.yaml')).reward.judge as Record<string, unknown>).prompt,
    'reference',
    'code-eval.yaml',
  );
  const messages: ChatMessage[] = [
    { role: 'system', content: SYSTEM },
    { role: 'user', content: 'Question: What is the capital of France?' },
    { role: 'assistant', content: '<python>\nprint(search_pages("France"))\n</python>' },
    { role: 'user', content: '<python_output>\nfound: Paris\n</python_output>' },
    { role: 'user', content: NOTICE },
    { role: 'assistant', content: '<answer>Lyon</answer>' },
  ];
  // episode.py format_for_judge: the system prompt and the "Question:" message left out.
  const trajectory =
    '[TURN 1 - AGENT]:\n<python>\nprint(search_pages("France"))\n</python>\n\n[EXECUTION RESULT]:\n<python_output>\nfound: Paris\n</python_output>\n\n[SYSTEM REMINDER]:\n[FINAL TURN] Answer now.\n\n[TURN 2 - AGENT]:\n<answer>Lyon</answer>';
  const c = (answer: string | null): RewardContext => ({
    question: 'What is the capital of France?',
    golds: ['Paris'],
    answer,
    episode: { turns: 2, messages },
  });
  t.equal(
    referenceJudgeMessage(c('Lyon')),
    pyFormat(REF_TEMPLATE, {
      question: 'What is the capital of France?',
      answer: 'Paris',
      response: 'Lyon',
      trajectory,
      schema: REF_SCHEMA,
    }),
  );
  t.match(referenceJudgeMessage(c(null)), "Agent's final answer: (no answer)\n", 'core.py 841');
  const b = backend('{"category": "incorrect", "approach_score": 40}');
  const seen: unknown[] = [];
  const spy: JudgeBackend = { description: 'spy', complete: async (ms) => (seen.push(ms), b.complete(ms)) };
  const r = await rewardFromConfig(
    {
      combine: 'sign_magnitude',
      parts: [{ kind: 'judge_correctness' }, { kind: 'judge_approach' }],
      judge: { prompt: 'reference' },
    } as never,
    { judgeBackend: spy },
  )(c('Lyon'));
  t.same(seen, [[{ role: 'user', content: referenceJudgeMessage(c('Lyon')) }]], 'one user message, no system prompt');
  t.equal(r.total, refReward(false, true, 40));
  for (const judge of [
    { prompt: 'theirs' },
    { prompt: 'reference', format: 'graded' },
    { prompt: 'reference', system_prompt: 'x' },
    { prompt: 'reference', approach: false, combine: 'weighted' },
  ])
    t.throws(
      () => rewardFromConfig({ parts: [{ kind: 'judge_correctness' }], judge } as never),
      { code: 'CONFIG_INVALID' },
      JSON.stringify(judge),
    );
  t.throws(() => judgeReward({ backend: b, prompt: 'reference', format: 'graded' }), { code: 'ARGUMENT_INVALID' });
});

t.test('data.train_questions: 300 of the 382 train questions, the same draw every time, at most all; eval untouched', async (t) => {
  const { writeFileSync } = await import('node:fs');
  const { questionSplits, trainSubset } = await import('../lib/train/data.js');
  const dir = t.testdir();
  const file = join(dir, 'q.jsonl');
  // 478 questions as wiki-trivia-questions-v4: the first 80 % (382) train, the last 96 evaluated (N:31-36).
  writeFileSync(
    file,
    Array.from({ length: 478 }, (_, i) => JSON.stringify({ id: `q${i}`, question: `Question ${i}?`, answer: `a${i}` })).join('\n') + '\n',
  );
  const all = await questionSplits({
    questions: file,
    eval_questions: null,
    split: { train_fraction: 0.8, seed: null },
    train_questions: null,
  });
  t.same([all.train.length, all.eval.length], [Math.round(478 * 0.8), 478 - Math.round(478 * 0.8)]);
  const s = await questionSplits({
    questions: file,
    eval_questions: null,
    split: { train_fraction: 0.8, seed: null },
    train_questions: 300,
  });
  t.equal(s.train.length, 300);
  t.same(
    s.eval.map((q) => q.id),
    all.eval.map((q) => q.id),
    'the evaluation questions are the same',
  );
  const ids = s.train.map((q) => q.index);
  t.equal(new Set(ids).size, 300, 'distinct');
  t.ok(
    ids.every((i) => i < 382),
    'all from the train split',
  );
  t.same(
    ids,
    [...ids].sort((x, y) => x - y),
    'in file order',
  );
  const again = await questionSplits({
    questions: file,
    eval_questions: null,
    split: { train_fraction: 0.8, seed: null },
    train_questions: 300,
  });
  t.same(
    again.train.map((q) => q.index),
    ids,
    'the same draw',
  );
  t.notSame(
    trainSubset(all.train, 300, 1).map((q) => q.index),
    ids,
    'another data.split.seed, another draw',
  );
  const more = await questionSplits({
    questions: file,
    eval_questions: null,
    split: { train_fraction: 0.8, seed: null },
    train_questions: 1000,
  });
  t.same(
    more.train.map((q) => q.index),
    all.train.map((q) => q.index),
    'more than there are: all of them (core.py 1116: min(num_samples, len))',
  );
  let err: unknown;
  try {
    validateConfig({ stage: 'grpo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c', train_questions: 0 } }, 'x');
  } catch (e) {
    err = e;
  }
  t.equal((err as { code?: string })?.code, 'CONFIG_INVALID');
});
