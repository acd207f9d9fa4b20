/**
 * The data of a stage: question rows (JSONL, JSON, Parquet, or a hub dataset) with their gold
 * answers and the config's train/eval split, and the chat conversations of data.sft.
 */
import { existsSync } from 'node:fs';
import { SlmError, describe } from '../errors.js';
import { localDataFiles } from '../hub/download.js';
import { isHubRef } from '../hub/ref.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import type { ResolvedConfig } from '../config/types.js';
import { readRows } from '../retrieval/corpus.js';
import { goldAnswers } from '../rewards/combine.js';
import { permutation } from './run.js';
import { readSftRows, type SftRow } from './sft/sft-data.js';

export interface Question {
  id: string;
  /** Position in the file. */
  index: number;
  question: string;
  golds: string[];
  /** Search-R1's `data_source` (nq, hotpotqa, ...) when the row has one. */
  data_source?: string;
  /**
   * The row's own chat prompt (Search-R1's processed files: `prompt`, a list of {role, content}) when
   * it has one: tags episodes start from exactly these messages (protocol.use_data_prompt).
   */
  prompt?: ChatMessage[];
}

/**
 * The question of a Search-R1 processed row that kept only its `prompt` (the template ends with
 * "Question: …"), for logs and rewards; the episode itself starts from the prompt (Question.prompt).
 */
function questionFromPrompt(prompt: unknown): string | undefined {
  if (!Array.isArray(prompt)) return undefined;
  const user = [...prompt].reverse().find((m) => m && m.role === 'user' && typeof m.content === 'string');
  const m = user ? /Question:\s*([^\n]+)\s*$/.exec(user.content) : null;
  return m ? m[1].trim() : undefined;
}

/**
 * Question rows from JSONL, JSON or Parquet: `question` and `answer` (a string, a list, or
 * Search-R1's `golden_answers` / `reward_model.ground_truth.target` lists of acceptable answers),
 * optional `id` and `data_source`. A row's `prompt` in chat format (Search-R1's processed files: a
 * list of {role, content}) is kept as Question.prompt; a row without `question` gives the one at the
 * end of its `prompt`. A `prompt` of another type (a plain string) is not used.
 */
export async function loadQuestions(file: string): Promise<Question[]> {
  if (!isHubRef(file) && !existsSync(file))
    throw new SlmError(
      'FILE_NOT_FOUND',
      `questions file ${file} does not exist. Set data.questions to JSONL/JSON/Parquet rows {question, answer}.`,
    );
  const rows = await readRows(file);
  if (!rows.length) throw new SlmError('DATA_INVALID', `${file} has no question rows.`);
  return rows.map((r, i) => {
    const o = (r ?? {}) as Record<string, unknown>;
    const question = typeof o.question === 'string' ? o.question : questionFromPrompt(o.prompt);
    if (typeof question !== 'string' || !question.trim())
      throw new SlmError(
        'DATA_INVALID',
        `${file}: row ${i + 1} needs a non-empty string "question", found ${describe(o.question)}. Question rows are {question, answer} (or Search-R1's {question, golden_answers}).${Array.isArray(o.messages) ? ' This row is a chat conversation ({messages}): SFT data, which belongs in data.sft of a stage: sft config.' : ''}`,
      );
    let prompt: ChatMessage[] | undefined;
    if (Array.isArray(o.prompt)) {
      const roles = ['system', 'user', 'assistant', 'tool'];
      const bad = o.prompt.findIndex((m) => !m || typeof m !== 'object' || !roles.includes(m.role) || typeof m.content !== 'string');
      if (bad >= 0 || !o.prompt.length)
        throw new SlmError(
          'DATA_INVALID',
          `${file}: row ${i + 1}: "prompt" is a list, so it must be chat messages {role: ${roles.join(' | ')}, content: string} (Search-R1's layout), but ${o.prompt.length ? `item ${bad + 1} is ${describe(o.prompt[bad])}` : 'it is empty'}.`,
        );
      prompt = o.prompt.map((m: { role: ChatMessage['role']; content: string }) => ({ role: m.role, content: m.content }));
    }
    const answer = o.answer ?? o.answers ?? o.golden_answers ?? o.reward_model;
    let golds: string[];
    try {
      golds = goldAnswers((answer as { ground_truth?: unknown })?.ground_truth ?? answer);
    } catch (e) {
      throw new SlmError('DATA_INVALID', `${file}: row ${i + 1}: ${(e as Error).message}`);
    }
    return {
      id: String(o.id ?? o.index ?? i),
      index: i,
      question,
      golds,
      ...(typeof o.data_source === 'string' ? { data_source: o.data_source } : {}),
      ...(prompt ? { prompt } : {}),
    };
  });
}

/** The split of the config: the first `train_fraction` by index (or after a seeded shuffle) train, the rest eval. */
export function splitQuestions<T>(rows: readonly T[], split: { train_fraction: number; seed: number | null }): { train: T[]; eval: T[] } {
  const order = split.seed === null ? rows.map((_, i) => i) : permutation(rows.length, split.seed, 0);
  const cut = Math.round(rows.length * split.train_fraction);
  return { train: order.slice(0, cut).map((i) => rows[i]), eval: order.slice(cut).map((i) => rows[i]) };
}

/**
 * The train and eval questions of a config. With data.eval_questions (Search-R1 trains on its
 * train.parquet and validates on its test.parquet: verl/trainer/config/ppo_trainer.yaml
 * data.train_files / data.val_files, set by train_ppo.sh) every row of data.questions is a train
 * question and every row of data.eval_questions an eval question; without it, data.split cuts
 * data.questions.
 */
export async function questionSplits(
  data: Pick<ResolvedConfig['data'], 'questions' | 'eval_questions' | 'split'> & Partial<Pick<ResolvedConfig['data'], 'train_questions'>>,
): Promise<{ train: Question[]; eval: Question[] }> {
  if (!data.questions)
    throw new SlmError('CONFIG_INVALID', 'data.questions is not set: expected question rows {question, answer}.', {
      path: 'data.questions',
    });
  const rows = await loadQuestions(data.questions);
  const s = data.eval_questions ? { train: rows, eval: await loadQuestions(data.eval_questions) } : splitQuestions(rows, data.split);
  const n = data.train_questions ?? null;
  // At most all of them, as the reference's min(num_samples, len(dataset)) (src/trainer/core.py 1116).
  if (n === null || n >= s.train.length) return s;
  return { train: trainSubset(s.train, n, data.split.seed ?? 0), eval: s.eval };
}

/**
 * data.train_questions: `n` of the train questions (all when there are no more), drawn with `seed` and kept in their order (the
 * reference code-search system trains on 300 of its 382, drawn once: configs/rl.yaml num_samples,
 * src/trainer/core.py 1113-1128). The same draw every epoch; the epochs' orders are the RL loop's.
 */
export function trainSubset<T>(train: readonly T[], n: number, seed: number): T[] {
  const keep = permutation(train.length, seed, 0x51ed)
    .slice(0, n)
    .sort((a, b) => a - b);
  return keep.map((i) => train[i]);
}

/**
 * The config as evaluation.ts `evalQuestions` must read it when data.eval_questions is set: the file
 * that eval.split names (eval: data.eval_questions; train: data.questions) as the whole of
 * data.questions, with eval.split all. Unchanged without data.eval_questions (the config refuses
 * eval.split all with it: a split then names one file).
 */
export function evalView(cfg: ResolvedConfig): ResolvedConfig {
  const file = cfg.data.eval_questions;
  if (!file || cfg.eval.split === 'all') return cfg;
  const questions = cfg.eval.split === 'eval' ? file : cfg.data.questions;
  return { ...cfg, data: { ...cfg.data, questions, eval_questions: null }, eval: { ...cfg.eval, split: 'all' } };
}

/**
 * The conversations of data.sft (every file of a hub dataset), without the rows marked
 * in_test_split when data.exclude_leaking is set; `dropped` counts those.
 */
export async function loadSftRows(file: string, excludeLeaking: boolean): Promise<{ rows: SftRow[]; dropped: number }> {
  const all = (await localDataFiles(file)).flatMap((f) => readSftRows(f));
  const rows = excludeLeaking ? all.filter((r) => r.in_test_split !== true) : all;
  return { rows, dropped: all.length - rows.length };
}
