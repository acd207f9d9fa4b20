/**
 * The one bootstrap of a policy: the native model (with its adapter), its tokenizer (whose token
 * bytes the engine gets once, for stop strings) and its chat template, from a model folder or an
 * `hf:OWNER/NAME` reference (downloaded once into the hub cache). Training, evaluation, the judge
 * on the native engine, `slm-train serve`, `generate`, `logits` and the rollout benchmark all load
 * through here.
 */
import { ChatFormatter } from '../model/chat.js';
import { loadTokenizer, type HfTokenizer } from '../model/tokenizer.js';
import { localModelDir } from '../hub/download.js';
import { Model, type LoadModelOptions } from './model.js';
import { setThreads } from './runtime.js';

export interface LoadPolicyOptions extends Omit<LoadModelOptions, 'adapter'> {
  /** A PEFT LoRA adapter folder (or hf:OWNER/NAME) loaded on top of the base weights; null/undefined = none. */
  adapter?: string | null;
  /** CPU threads for libtorch, set before loading (undefined = leave as it is). */
  threads?: number;
  /** Load the folder's tokenizer and give the engine its token bytes (default true). */
  tokenizer?: boolean;
  /** Load the folder's chat template (default: as `tokenizer`). */
  chat?: boolean;
  /**
   * The chat template to use instead of the folder's: a template file, or the name of one shipped
   * with the package (chatml, qwen3, qwen3-instruct); null/undefined = the folder's own.
   */
  chatTemplate?: string | null;
}

export interface Policy {
  model: Model;
  tokenizer: HfTokenizer;
  formatter: ChatFormatter;
  /** The local model folder (a hub reference resolved). */
  dir: string;
  /** The local adapter folder, when one was loaded. */
  adapter?: string;
}

/** What loadPolicy gives when the tokenizer or the chat template was not asked for. */
export type PartialPolicy = Omit<Policy, 'tokenizer' | 'formatter'> & { tokenizer?: HfTokenizer; formatter?: ChatFormatter };

export async function loadPolicy(path: string, opts?: LoadPolicyOptions & { tokenizer?: true; chat?: true }): Promise<Policy>;
export async function loadPolicy(path: string, opts: LoadPolicyOptions): Promise<PartialPolicy>;
export async function loadPolicy(path: string, opts: LoadPolicyOptions = {}): Promise<PartialPolicy> {
  if (opts.threads !== undefined) setThreads(opts.threads);
  const dir = await localModelDir(path);
  const adapter = opts.adapter ? await localModelDir(opts.adapter) : undefined;
  const model = await Model.load(dir, { dtype: opts.dtype, device: opts.device, adapter });
  try {
    const withTokenizer = opts.tokenizer ?? true;
    const tokenizer = withTokenizer ? loadTokenizer(dir) : undefined;
    // Checkpoints with more embedding rows than tokens (Qwen3) get the tokenizer's bytes; a
    // tokenizer larger than the model's vocabulary is left out of the engine (stop strings off).
    if (tokenizer && tokenizer.vocabSize <= model.vocabSize) model.setVocab(tokenizer.tokenBytes());
    const formatter = (opts.chat ?? withTokenizer) ? ChatFormatter.forModel(dir, { template: opts.chatTemplate }) : undefined;
    return { model, dir, ...(adapter ? { adapter } : {}), ...(tokenizer ? { tokenizer } : {}), ...(formatter ? { formatter } : {}) };
  } catch (e) {
    model.dispose();
    throw e;
  }
}
