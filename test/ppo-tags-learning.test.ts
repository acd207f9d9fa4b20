// RL that demonstrably learns, PPO with Search-R1's tags protocol at CPU scale: SFT on imperfect
// expert trajectories, then PPO with the exact-match reward, raises exact match on HELD-OUT questions
// (entities no trajectory and no PPO rollout ever named) well above the SFT adapter's, for every seed.
//
// Everything goes through the real machinery: the tags protocol (lib/episodes/protocol.ts) over a
// BM25 SearchIndex, the EpisodeRunner (the expert's trajectories are runner episodes, so SFT sees
// exactly a rollout's tokens and mask), runSft, then PPO and both evaluations through
// trainFromConfig / evalFromConfig with configs written to disk (value head, GAE, KL to the frozen
// SFT adapter, greedy evaluation).
//
// The world, small enough for a 2-layer hidden-128 random model to learn in seconds:
// - 256 fictional entities named by two words ("Vusaz Rotek"), each word one BPE token, 16 words per
//   slot; one page each ("Vusaz Rotek is red.", six colours); "What color is Vusaz Rotek?"
//   (protocol.instruction "{question}"). The names are compositional: copying a two-token name into
//   the query generalises to unseen combinations after ~200 SFT steps, where single-token invented
//   names took 800-1400 steps (the copy had to be learned for tokens never trained on) and
//   multi-syllable ones were never copied;
// - 96 entities give the SFT trajectories, 96 others PPO's training questions, the last 64 the
//   held-out evaluation; one search (`<search> NAME</search>`), the top-3 passages inline (mask 0),
//   then `<answer>`;
// - the expert is imperfect in the way exact match punishes: half of its trajectories answer in a
//   sentence ("It is red.") instead of the bare value. SFT imitates that; PPO, rewarded by exact match
//   only, learns the bare answer on entities it never saw while keeping the query copying and the
//   reading SFT taught. Held-out EM over seeds 0-9 (this machine): SFT 0.02-0.75, PPO 0.56-1.00,
//   gains 0.20-0.97 (mean 0.55). Most of the gain is the answer form: SFT's substring EM (gold inside
//   the answer, "It is red." counted) is 0.48-0.95, and PPO's exact match reaches or passes it in 9
//   seeds of 10 (seed 6: 0.953 -> 0.891), so the searching is kept, not traded for the form.
// Designs where SFT was limited in quantity instead (few trajectories or early stopping, so that the
// query copying or the reading was partly learned, or an expert that read the second passage) gave
// PPO held-out gains of -0.2 to +0.36 within this budget, not reliably positive: the tiny model
// memorised its training questions before it generalised, in SFT and in PPO alike.
//
// Timing (2 cores shared with other work): ~32 s per seed (SFT 300 steps ~14 s, PPO 30 steps
// ~15-20 s), ~80 s for the file. PPO_TAGS_SEEDS=0,1,2 overrides the seeds (for sweeps).
import t from 'tap';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import { loadConfig } from '../lib/config/load.js';
import type { ResolvedConfig } from '../lib/config/types.js';
import { trainByteLevelBpe } from '../lib/demo/bpe.js';
import type { LoraSpec } from '../lib/engine/adapter.js';
import type { GenerateRequest, GenerateResult, TextGenerator } from '../lib/engine/types.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import type { HfTokenizer } from '../lib/model/tokenizer.js';
import { RunFolder } from '../lib/train/run.js';
import { episodeRunner, loadAgent, openEnvironment } from '../lib/train/environment.js';
import { evalFromConfig } from '../lib/train/evaluation.js';
import { trainFromConfig } from '../lib/train/session.js';
import { runSft } from '../lib/train/sft/sft.js';
import { xorshift32 } from '../lib/util/data.js';

const SEEDS = (process.env.PPO_TAGS_SEEDS ?? '0,1').split(',').map(Number);
/**
 * PPO's held-out EM must beat the SFT adapter's by MARGIN for each seed and by MEAN_MARGIN on average
 * (smallest gain seen over seeds 0-9: 0.20), and stay within SKILL_SLACK of SFT's substring EM.
 */
const MARGIN = 0.1;
const MEAN_MARGIN = 0.2;
const SKILL_SLACK = 0.1;

// ---------------------------------------------------------------------------------------------
// The world

const COLORS = ['red', 'blue', 'green', 'black', 'gray', 'pink'];
const TAGS = ['<search>', '</search>', '<answer>', '</answer>', '<information>', '</information>'];
const SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
const CHAT_TEMPLATE =
  "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";

interface Entity {
  name: string;
  color: string;
}

/** 16 x 16 two-word names, shuffled, colours spread evenly then shuffled; all from a fixed seed. */
function makeWorld(): { entities: Entity[]; words: string[] } {
  const r = xorshift32(20250611);
  const pick = (xs: string) => xs[Math.floor(r() * xs.length)];
  const shuffle = <T>(xs: T[]) => {
    for (let i = xs.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [xs[i], xs[j]] = [xs[j], xs[i]];
    }
    return xs;
  };
  const used = new Set<string>();
  const word = () => {
    for (;;) {
      const w = pick('bdfgklmnprstvz').toUpperCase() + pick('aeiou') + pick('bdfgklmnprstvz') + pick('aeiou') + pick('bdfgklmnprstvz');
      if (!used.has(w)) return (used.add(w), w);
    }
  };
  const first = Array.from({ length: 16 }, word);
  const second = Array.from({ length: 16 }, word);
  const names = shuffle(first.flatMap((a) => second.map((b) => `${a} ${b}`)));
  const colors = shuffle(names.map((_, i) => COLORS[i % COLORS.length]));
  return { entities: names.map((name, i) => ({ name, color: colors[i] })), words: [...first, ...second] };
}

const question = (e: Entity) => `What color is ${e.name}?`;
const page = (e: Entity) => ({ id: e.name.toLowerCase().replace(' ', '-'), title: e.name, content: `${e.name} is ${e.color}.` });
const sentence = (color: string) => `It is ${color}.`;

/**
 * The scripted expert as a TextGenerator, so that its trajectories are EpisodeRunner episodes: before
 * any search result it writes `<search> NAME</search>` with the name of the question; after the
 * results it answers with the colour of the first passage, as the bare value or (for the questions in
 * `sentences`) as a sentence. Log-probs 0 (SFT does not use them).
 */
function expert(tok: HfTokenizer, sentences: ReadonlySet<string>): TextGenerator {
  return {
    async generate(req: GenerateRequest): Promise<GenerateResult> {
      const tokens = req.prompts.map((p) => {
        const text = tok.decode(Array.from(p));
        const name = /What color is ([\w ]+)\?/.exec(text)?.[1] ?? '';
        const info = /<information>([\s\S]*?)<\/information>\s*$/.exec(text);
        let turn = `<search> ${name}</search>`;
        if (info) {
          const color = /^Doc 1\(Title: [^)]*\) [^\n]*? is (\w+)\./.exec(info[1])?.[1] ?? 'unknown';
          turn = `<answer> ${sentences.has(name) ? sentence(color) : color}</answer>`;
        }
        return Int32Array.from(tok.encode(turn));
      });
      return { tokens, logprobs: tokens.map((x) => new Float32Array(x.length)), finishReasons: tokens.map(() => 'stop_string' as const) };
    },
  };
}

const { entities, words } = makeWorld();
const sftEntities = entities.slice(0, 96);
const trainEntities = entities.slice(96, 192);
const heldOut = entities.slice(192);
// Every other expert trajectory answers in a sentence.
const sentences = new Set(sftEntities.filter((_, i) => i % 2 === 1).map((e) => e.name));

let root: string;
let tokenizerJson: Record<string, unknown>;
t.before(() => {
  root = t.testdir();
  writeFileSync(join(root, 'corpus.jsonl'), entities.map((e) => JSON.stringify(page(e))).join('\n') + '\n');
  // PPO's training questions, then the held-out ones (data.split: the first 96 train, the rest eval).
  writeFileSync(
    join(root, 'questions.jsonl'),
    [...trainEntities, ...heldOut].map((e, i) => JSON.stringify({ id: `q${i}`, question: question(e), answer: e.color })).join('\n') + '\n',
  );
  // The tokenizer learns from the texts as the model sees them (chat markers and tags are added tokens).
  const texts = entities.map(
    (e) =>
      `<|im_start|>user\n${question(e)}<|im_end|>\n<|im_start|>assistant\n<search> ${e.name}</search>\n\n<information>Doc 1(Title: ${e.name}) ${e.name}. ${page(e).content}</information>\n\n<answer> ${e.color}</answer><answer> ${sentence(e.color)}</answer>`,
  );
  tokenizerJson = trainByteLevelBpe(texts, { merges: 500, special: SPECIAL, added: TAGS });
});

function writeModel(dir: string, seed: number): void {
  mkdirSync(dir, { recursive: true });
  const added = tokenizerJson.added_tokens as Array<{ id: number; content: string }>;
  const idOf = (c: string) => added.find((x) => x.content === c)!.id;
  initModel({
    preset: 'tiny',
    out: dir,
    seed: 100 + seed,
    overrides: {
      vocab_size: Math.max(...added.map((x) => x.id)) + 1,
      hidden_size: 128,
      intermediate_size: 384,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      head_dim: 32,
      max_window_layers: 2,
      bos_token_id: idOf('<|endoftext|>'),
      eos_token_id: idOf('<|im_end|>'),
    },
    embedStd: 0.15,
  });
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson));
  writeFileSync(
    join(dir, 'tokenizer_config.json'),
    JSON.stringify({
      tokenizer_class: 'PreTrainedTokenizerFast',
      bos_token: null,
      eos_token: '<|im_end|>',
      pad_token: '<|endoftext|>',
      model_max_length: 512,
    }),
  );
  writeFileSync(join(dir, 'chat_template.jinja'), CHAT_TEMPLATE);
}

const LORA: LoraSpec = { r: 32, alpha: 64, dropout: 0, rslora: false, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj'] };

/** The PPO stage's config (its base keys also serve the evaluations), written to disk and loaded. */
function ppoConfig(dir: string, seed: number, sftAdapter: string): ResolvedConfig {
  const base = {
    model: { path: join(dir, 'model'), dtype: 'float32', device: 'cpu' },
    lora: { r: LORA.r, alpha: LORA.alpha, dropout: LORA.dropout, targets: LORA.targets },
    data: {
      questions: join(root, 'questions.jsonl'),
      corpus: join(root, 'corpus.jsonl'),
      index: join(dir, 'index'),
      split: { train_fraction: trainEntities.length / (trainEntities.length + heldOut.length) },
    },
    // One search (max_turns counts searches), then an answer; the question is the whole user message.
    protocol: { kind: 'tags', instruction: '{question}', max_turns: 1, max_new_tokens: 8, max_context: 256, top_k: 3 },
    retrieval: { kind: 'bm25' },
    reward: { parts: [{ kind: 'em', weight: 1 }] },
    eval: { split: 'eval', temperature: 0 },
    run: { dir: join(dir, 'runs') },
  };
  // PPO from the SFT adapter: 16 questions x 2 rollouts per step at temperature 1, two passes of two
  // mini-batches, value head (critic lr), GAE with gamma = lambda = 1, KL 0.001 in the reward against
  // the frozen SFT adapter (kl_reference start, the default).
  const file = join(dir, 'ppo.yaml');
  writeFileSync(
    file,
    YAML.stringify({
      stage: 'ppo',
      ...base,
      model: { ...base.model, adapter: sftAdapter },
      rollout: { k: 2, batch_questions: 16, temperature: 1 },
      algorithm: { kl_coef: 0.001, kl_in: 'reward', gamma: 1, lam: 1, vf_coef: 0.5, inner_epochs: 2, mini_batch: 16 },
      optim: { lr: 3e-4, critic_lr: 1e-2, schedule: 'constant', gradient_checkpointing: false },
      train: { steps: 30, seed, checkpoint_every: 0 },
      run: { ...base.run, name: 'ppo' },
    }),
  );
  return loadConfig(file);
}

t.test('the world: every name word and answer is one token; expert trajectories are rollout-shaped', async (t) => {
  const dir = join(root, 'check');
  writeModel(join(dir, 'model'), 0);
  const tok = loadTokenizer(join(dir, 'model'));
  for (const w of [...words, ...COLORS, 'It'])
    if (tok.encode(` ${w}`).length !== 1) t.fail(`" ${w}" is ${tok.encode(` ${w}`).length} tokens`);
  t.equal(tok.encode(' ' + heldOut[0].name).length, 2, 'a name is two tokens');
  const ppo = ppoConfig(dir, 0, join(dir, 'unused'));
  const env = await openEnvironment(ppo);
  const agent = await loadAgent(ppo, null);
  t.teardown(() => agent.model.dispose());
  const qs = sftEntities.slice(0, 8);
  const { episodes } = await episodeRunner(ppo, agent, env, { seed: 0, generator: expert(agent.tokenizer, sentences) }).run(
    qs.map((e) => ({ question: question(e) })),
  );
  let checked = 0;
  episodes.forEach((ep, i) => {
    const e = qs[i];
    const [prompt, search, info, answer] = ep.segments;
    // The loss mask: 1 on the two generated turns, 0 on the prompt and on the retrieved passages.
    const mask = [
      ...Array(prompt.tokens).fill(0),
      ...Array(search.tokens).fill(1),
      ...Array(info.tokens).fill(0),
      ...Array(answer.tokens).fill(1),
    ];
    if (JSON.stringify(ep.calls.map((c) => c.args)) !== JSON.stringify([[e.name]]))
      t.fail(`${e.name}: searched ${JSON.stringify(ep.calls.map((c) => c.args))}`);
    else if (ep.answer !== (sentences.has(e.name) ? sentence(e.color) : e.color))
      t.fail(`${e.name}: answered ${ep.answer}, gold ${e.color}`);
    else if (ep.segments.map((s) => s.source).join() !== 'prompt,model,env,model' || !/^\n\n<information>Doc 1\(Title: /.test(info.text))
      t.fail(`${e.name}: segments ${JSON.stringify(ep.segments)}`);
    else if (JSON.stringify(Array.from(ep.lossMask)) !== JSON.stringify(mask))
      t.fail(`${e.name}: loss mask ${Array.from(ep.lossMask).join('')}`);
    else checked++;
  });
  t.equal(
    checked,
    qs.length,
    'each: one search for the name, the answer read from the first passage, the passages inline with loss mask 0',
  );
  t.ok(sentences.has(qs[1].name) && !sentences.has(qs[0].name), 'every other expert trajectory answers in a sentence');
});

interface SeedResult {
  seed: number;
  sft: number;
  ppo: number;
  /** Substring EM (gold inside the answer): what SFT would score if "It is red." counted. */
  sftSubem: number;
  ppoSubem: number;
  sftSeconds: number;
  ppoSeconds: number;
  rewardFirst: number;
  rewardLast: number;
}

async function pipeline(seed: number): Promise<SeedResult> {
  const dir = join(root, `seed-${seed}`);
  writeModel(join(dir, 'model'), seed);
  const sftAdapter = join(dir, 'runs', 'sft', 'adapter');
  const cfg = ppoConfig(dir, seed, sftAdapter);
  // 1. expert trajectories through the real protocol, index and runner -> SFT examples (ids + loss mask).
  // Not chat rows through data.sft: an inline tags episode is one assistant message, and SFT's
  // tokenizeConversation trains on all of it, the retrieved passages included.
  const env = await openEnvironment(cfg);
  const agent = await loadAgent(cfg, null);
  let sftSeconds: number;
  try {
    const { episodes } = await episodeRunner(cfg, agent, env, { seed, generator: expert(agent.tokenizer, sentences) }).run(
      sftEntities.map((e) => ({ question: question(e) })),
    );
    const examples = episodes.map((ep, row) => ({ ids: Array.from(ep.ids), mask: Array.from(ep.lossMask), row }));
    // 2. SFT: 300 steps of 8 trajectories (25 epochs of the 96), constant lr 3e-3
    const t0 = performance.now();
    await runSft(agent.model, examples, new RunFolder(join(dir, 'runs', 'sft')), {
      lora: LORA,
      epochs: 25,
      maxSteps: 300,
      batchSize: 8,
      schedule: { kind: 'constant', lr: 3e-3 },
      gradientCheckpointing: false,
      seed,
    });
    await agent.model.saveAdapter(sftAdapter);
    sftSeconds = (performance.now() - t0) / 1e3;
  } finally {
    agent.model.dispose();
    await env.close();
  }
  // 3. held-out EM of the SFT adapter, PPO from it, held-out EM of the PPO adapter
  const sft = await evalFromConfig(cfg, { adapter: sftAdapter, label: 'sft' });
  const t1 = performance.now();
  const rl = await trainFromConfig(cfg);
  const ppoSeconds = (performance.now() - t1) / 1e3;
  const ppo = await evalFromConfig(cfg, { adapter: rl.adapter, label: 'ppo' });
  const r = rl.meanReward ?? [];
  const avg = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  return {
    seed,
    sft: sft.summary.em,
    ppo: ppo.summary.em,
    sftSubem: sft.summary.subem,
    ppoSubem: ppo.summary.subem,
    sftSeconds,
    ppoSeconds,
    rewardFirst: avg(r.slice(0, 5)),
    rewardLast: avg(r.slice(-5)),
  };
}

t.test(`SFT -> PPO raises held-out EM over SFT (seeds ${SEEDS.join(', ')})`, async (t) => {
  const t0 = performance.now();
  const results: SeedResult[] = [];
  for (const seed of SEEDS) {
    const r = await pipeline(seed);
    results.push(r);
    t.comment(
      `seed ${seed}: held-out EM SFT ${r.sft.toFixed(3)} -> PPO ${r.ppo.toFixed(3)} (substring EM ${r.sftSubem.toFixed(3)} -> ${r.ppoSubem.toFixed(3)}); PPO reward ${r.rewardFirst.toFixed(2)} (first 5 steps) -> ${r.rewardLast.toFixed(2)} (last 5); SFT ${r.sftSeconds.toFixed(0)} s, PPO ${r.ppoSeconds.toFixed(0)} s`,
    );
  }
  for (const r of results) {
    t.ok(
      r.ppo >= r.sft + MARGIN,
      `seed ${r.seed}: held-out EM ${r.sft.toFixed(3)} (SFT) -> ${r.ppo.toFixed(3)} (PPO), margin ${(r.ppo - r.sft).toFixed(3)} >= ${MARGIN}`,
    );
    t.ok(
      r.ppo >= r.sftSubem - SKILL_SLACK,
      `seed ${r.seed}: PPO's EM ${r.ppo.toFixed(3)} >= SFT's substring EM ${r.sftSubem.toFixed(3)} - ${SKILL_SLACK} (the search was kept)`,
    );
    t.ok(
      r.rewardLast > r.rewardFirst,
      `seed ${r.seed}: PPO's training reward rose (${r.rewardFirst.toFixed(2)} -> ${r.rewardLast.toFixed(2)})`,
    );
  }
  const gain = results.reduce((a, r) => a + r.ppo - r.sft, 0) / results.length;
  t.ok(gain >= MEAN_MARGIN, `mean held-out EM gain ${gain.toFixed(3)} >= ${MEAN_MARGIN}`);
  t.comment(`total ${((performance.now() - t0) / 1e3).toFixed(0)} s for ${SEEDS.length} seeds`);
});
