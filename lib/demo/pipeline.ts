/**
 * The embedded demo (`npx slm-train` with no arguments): the whole pipeline at toy scale on this
 * machine, with nothing downloaded.
 *   1. a fictional encyclopedia (rare by construction) with questions, split 80/20 by index;
 *   2. a byte-level BPE tokenizer learned from it (~1k ids) and a randomly initialised tiny Qwen3
 *      that uses it, in Hugging Face layout;
 *   3. the search index; expert trajectories from a scripted expert run through the real sandbox,
 *      for half of the training questions (limited expert data, as the reference's), with a habit
 *      the student cannot follow: on questions about founders and fairs the expert mostly prints
 *      the fact and answers in a second turn, and the tiny model cannot copy a printed name into
 *      <answer>;
 *   4. eval of the untrained model -> SFT on the expert trajectories -> eval -> GRPO on every
 *      training question (exact-match reward) -> eval: SFT imitates the habit and fails those
 *      questions; GRPO finds that final_answer() in the program works for them too;
 *   5. a table (accuracy, EM, F1, answered, average turns, time) and the run folder.
 * Every stage goes through the same code as `slm-train train` / `eval`, with configs written into
 * the run folder so each stage can be re-run by hand.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import YAML from 'yaml';
import { loadConfig } from '../config/load.js';
import { LORA_TARGETS } from '../engine/adapter.js';
import { initModel } from '../model/init.js';
import { loadTokenizer } from '../model/tokenizer.js';
import { syntheticCorpus, type SyntheticQuestion, type SyntheticQuestionKind } from '../retrieval/synthetic.js';
import { openEnvironment, type Log } from '../train/environment.js';
import { evalFromConfig, type EvalSummary } from '../train/evaluation.js';
import { trainFromConfig } from '../train/session.js';
import { trainByteLevelBpe } from './bpe.js';
import { Progress, type ProgressTo } from '../util/progress.js';
import { DEMO_SYSTEM_PROMPT, expertProgram, expertTrajectories } from './expert.js';
import { hashUniform } from '../util/hash.js';
import { permutation } from '../train/run.js';

export interface DemoOptions {
  out: string;
  /** Pages of the generated corpus (5 questions each). */
  pages?: number;
  /**
   * Expert trajectories SFT trains on: a seeded sample of the training questions, solved by the
   * scripted expert (the reference had ~40 usable ones for 382 training questions). GRPO then trains
   * on every training question.
   */
  sftExamples?: number;
  /**
   * The expert's habit: for questions about founders and fairs (PRINTING_KINDS) it prints the fact
   * and answers in a second turn this share of the time (default 0.7), instead of final_answer() in
   * the program. The demo's model cannot carry a printed name over into <answer>, so SFT imitates a
   * habit that fails for it; GRPO can find that final_answer() works there too.
   */
  printShare?: number;
  sftEpochs?: number;
  grpoSteps?: number;
  /** Config values over the demo's own (deep-merged), per stage: for experiments and tests. */
  overrides?: { sft?: Record<string, unknown>; grpo?: Record<string, unknown> };
  seed?: number;
  log?: Log;
  /** Progress bars of every long phase (the CLI: stderr); default none. */
  progress?: ProgressTo;
}

export interface DemoStage {
  stage: string;
  summary: EvalSummary;
  train_s: number;
}

export interface DemoResult {
  dir: string;
  stages: DemoStage[];
  table: string;
  expert: { accepted: number; rejected: number; printing: number };
}

const CHAT_TEMPLATE =
  "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";

export async function runDemo(o: DemoOptions): Promise<DemoResult> {
  const log = o.log ?? (() => {});
  const dir = resolve(o.out);
  const seed = o.seed ?? 0;
  const paths = { model: join(dir, 'model'), data: join(dir, 'data'), configs: join(dir, 'configs'), runs: join(dir, 'runs') };
  for (const p of Object.values(paths)) mkdirSync(p, { recursive: true });

  // 1. corpus and questions
  const gen = syntheticCorpus({ pages: o.pages ?? 150, seed: 11 + seed });
  const corpusFile = join(paths.data, 'corpus.jsonl');
  const questionsFile = join(paths.data, 'questions.jsonl');
  writeFileSync(corpusFile, gen.pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  writeFileSync(questionsFile, gen.questions.map((q) => JSON.stringify({ id: q.id, question: q.question, answer: q.answer, kind: q.kind })).join('\n') + '\n');
  const cut = Math.round(gen.questions.length * 0.8);
  const train = gen.questions.slice(0, cut);
  log(`corpus: ${gen.pages.length} fictional pages, ${gen.questions.length} questions (${train.length} train, ${gen.questions.length - cut} eval)`);

  // 2. tokenizer and model
  const special = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  const tags = ['<python>', '</python>', '<python_output>', '</python_output>', '<answer>', '</answer>'];
  // The texts as the model will see them: the system prompt opens every episode, so it counts once
  // per question (learned once, its words stayed in pieces: 197 tokens instead of ~60).
  const texts = [...gen.pages.map((p) => `# ${p.title}\n${p.content}`), ...gen.questions.flatMap((q) => [DEMO_SYSTEM_PROMPT, `Question: ${q.question}\n${expertProgram(q)}\n${expertProgram(q, 'print')}\n${q.answer}`])];
  const tj = trainByteLevelBpe(texts, { merges: 700, special, added: tags });
  const added = tj.added_tokens as Array<{ id: number; content: string }>;
  const idOf = (content: string) => added.find((t) => t.content === content)!.id;
  const vocab = Math.max(...added.map((t) => t.id)) + 1;
  initModel({
    preset: 'tiny',
    out: paths.model,
    seed: 1 + seed,
    overrides: { vocab_size: vocab, hidden_size: 128, intermediate_size: 384, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32, max_window_layers: 4, bos_token_id: idOf('<|endoftext|>'), eos_token_id: idOf('<|im_end|>') },
    embedStd: 0.15,
  });
  writeFileSync(join(paths.model, 'tokenizer.json'), JSON.stringify(tj));
  writeFileSync(join(paths.model, 'tokenizer_config.json'), JSON.stringify({ tokenizer_class: 'PreTrainedTokenizerFast', bos_token: null, eos_token: '<|im_end|>', pad_token: '<|endoftext|>', model_max_length: 4096 }, null, 2) + '\n');
  writeFileSync(join(paths.model, 'chat_template.jinja'), CHAT_TEMPLATE);
  const tok = loadTokenizer(paths.model);
  log(`model: tiny Qwen3 (4 layers, hidden 128) with its own ${tok.vocabSize}-token BPE tokenizer, in ${paths.model}`);

  // 3. configs (the same files `slm-train train --config` takes)
  const base = {
    model: { path: paths.model, dtype: 'float32', device: 'cpu' },
    lora: { r: 32, alpha: 64, dropout: 0, targets: [...LORA_TARGETS] },
    data: { questions: questionsFile, corpus: corpusFile, index: join(dir, 'index'), split: { train_fraction: 0.8 } },
    protocol: { kind: 'code', max_turns: 2, max_new_tokens: 96, max_context: 1024, system_prompt: DEMO_SYSTEM_PROMPT, question_variable: 'question', final_answer: true },
    sandbox: { kind: 'python', workers: 2, timeout_s: 5 },
    // BM25: the made-up town names are rare words it ranks first; the hashing embedder's n-grams
    // are not (hybrid fusion put another town's page first for 53 of the 120 river questions).
    retrieval: { kind: 'bm25' },
    // Exact match: F1's partial credit was hacked (answers padded with words of the page).
    reward: { parts: [{ kind: 'em', weight: 1 }] },
    eval: { split: 'eval', temperature: 0 },
    run: { dir: paths.runs },
  };
  const sftFile = join(paths.data, 'expert.jsonl');
  const write = (name: string, c: object, over: Record<string, unknown> = {}) => {
    const f = join(paths.configs, `${name}.yaml`);
    writeFileSync(f, `# Written by the slm-train demo; run it again with: slm-train train --config ${f}\n` + YAML.stringify(deepMerge(c, over)));
    return loadConfig(f);
  };
  const sftCfg = write(
    'sft',
    { stage: 'sft', ...base, data: { ...base.data, sft: sftFile }, optim: { lr: 3e-3, schedule: 'cosine', warmup_steps: 5, gradient_checkpointing: false }, train: { epochs: o.sftEpochs ?? 12, batch_size: 8, seed, checkpoint_every: 0 }, run: { ...base.run, name: 'sft' } },
    o.overrides?.sft,
  );
  const grpoCfg = write(
    'grpo',
    {
      stage: 'grpo',
      ...base,
      model: { ...base.model, adapter: join(paths.runs, 'sft', 'adapter') },
      // Samples like the policy at its best, as the reference samples (temperatures drawn per rollout,
      // nucleus sampling): at temperature 1 without top-p, the 2026-11-23 demo's SFT policy answered
      // 40 % of the held-out questions greedily but its samples earned 6 %, so 2-4 of every 4 groups
      // were all-fail and skipped and GRPO learned from a handful of lucky episodes.
      rollout: { k: 8, batch_questions: 8, temperature: [0.7, 1.0], top_p: 0.9 },
      // A KL term to the SFT adapter (the default reference of a stage that starts from one) keeps
      // what SFT got right while GRPO changes the rest.
      algorithm: { kl_coef: 0.02 },
      // Warm-up: Adam's first steps move every weight by about the learning rate whatever the
      // gradient's size (its moment estimates start at the first gradient).
      optim: { lr: 2e-4, warmup_steps: 5, gradient_checkpointing: false },
      train: { steps: o.grpoSteps ?? 20, seed, checkpoint_every: 0 },
      run: { ...base.run, name: 'grpo' },
    },
    o.overrides?.grpo,
  );

  // 4. expert trajectories through the real sandbox and protocol
  let t = performance.now();
  const env = await openEnvironment(grpoCfg, log, o.progress);
  let expert: { accepted: number; rejected: number; printing: number };
  // Limited expert data, as the reference's: the expert solves a seeded sample of the training
  // questions; GRPO later trains on all of them.
  const expertQs = permutation(train.length, seed, 0)
    .slice(0, Math.min(train.length, o.sftExamples ?? 300))
    .map((i) => train[i]);
  const bar = new Progress('expert', expertQs.length, 'questions', o.progress);
  try {
    const share = o.printShare ?? 0.7;
    const style = (q: SyntheticQuestion) => (PRINTING_KINDS.includes(q.kind) && hashUniform(seed, 7, Number(q.id.split('-').pop())) < share ? 'print' : 'final_answer');
    const ex = await expertTrajectories(expertQs, env.protocol, { maxTurns: grpoCfg.protocol.max_turns, answer: style, onDone: () => bar.increment() });
    writeFileSync(sftFile, ex.rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const printing = ex.rows.filter((r) => r.messages.length > 3).length;
    expert = { accepted: ex.rows.length, rejected: ex.rejected, printing };
    log(`expert: ${ex.rows.length} trajectories, ${printing} of them printing the fact and answering in a second turn (${ex.rejected} rejected: the program's answer was not the gold one) in ${((performance.now() - t) / 1e3).toFixed(1)} s`);
  } finally {
    bar.stop();
    await env.close();
  }

  // 5. baseline -> SFT -> eval -> GRPO -> eval
  const stages: DemoStage[] = [];
  const evaluate = async (stage: string, adapter: string | null, trainS: number) => {
    const r = await evalFromConfig(grpoCfg, { adapter, label: stage, log, progress: o.progress });
    stages.push({ stage, summary: r.summary, train_s: trainS });
    log(`${stage}: accuracy ${(100 * r.summary.accuracy).toFixed(1)} %, F1 ${(100 * r.summary.f1).toFixed(1)} %, answered ${(100 * r.summary.answered).toFixed(1)} %, avg turns ${r.summary.avg_turns.toFixed(2)}`);
  };
  await evaluate('baseline', null, 0);
  t = performance.now();
  const sft = await trainFromConfig(sftCfg, { log, progress: o.progress, configFile: join(paths.configs, 'sft.yaml') });
  await evaluate('sft', sft.adapter, (performance.now() - t) / 1e3);
  t = performance.now();
  const rl = await trainFromConfig(grpoCfg, { log, progress: o.progress, configFile: join(paths.configs, 'grpo.yaml') });
  await evaluate('grpo', rl.adapter, (performance.now() - t) / 1e3);

  const table = demoTable(stages);
  writeFileSync(join(dir, 'report.md'), `# slm-train demo\n\n${new Date().toISOString()}\n\n${table}\n\nExpert trajectories: ${expert.accepted} (${expert.rejected} rejected).\n\nRun reports (curves, evaluations, sampled trajectories): runs/sft/report.html, runs/grpo/report.html.\n`);
  return { dir, stages, table, expert };
}

/** The kinds of question the expert tends to answer in two turns (DemoOptions.printShare). */
export const PRINTING_KINDS: readonly SyntheticQuestionKind[] = ['founder', 'fair'];

/** `over` merged into `base`: objects key by key, anything else replaced. */
function deepMerge(base: object, over: Record<string, unknown>): object {
  const out: Record<string, unknown> = { ...(base as Record<string, unknown>) };
  for (const [k, v] of Object.entries(over)) {
    const b = out[k];
    out[k] = v && typeof v === 'object' && !Array.isArray(v) && b && typeof b === 'object' && !Array.isArray(b) ? deepMerge(b, v as Record<string, unknown>) : v;
  }
  return out;
}

function demoTable(stages: readonly DemoStage[]): string {
  const pct = (x: number) => (100 * x).toFixed(1);
  return [
    '| stage | accuracy % | EM % | F1 % | answered % | avg turns | train time s | eval time s |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
    ...stages.map((s) => `| ${s.stage} | ${pct(s.summary.accuracy)} | ${pct(s.summary.em)} | ${pct(s.summary.f1)} | ${pct(s.summary.answered)} | ${s.summary.avg_turns.toFixed(2)} | ${s.train_s.toFixed(0)} | ${s.summary.time_s.toFixed(0)} |`),
  ].join('\n');
}
