/**
 * A model with everything needed to run episodes: the native model (with its adapter), its
 * tokenizer (whose token bytes the engine gets once, for stop strings) and its chat template.
 */
import { ChatFormatter } from '../model/chat.js';
import { loadTokenizer, type HfTokenizer } from '../model/tokenizer.js';
import { SlmError } from '../errors.js';
import { Model, type LoadModelOptions } from './model.js';

export interface Policy {
  model: Model;
  tokenizer: HfTokenizer;
  chat: ChatFormatter;
  dispose(): void;
}

export async function loadPolicy(dir: string, opts: LoadModelOptions = {}): Promise<Policy> {
  const model = await Model.load(dir, opts);
  try {
    const tokenizer = loadTokenizer(dir);
    if (tokenizer.vocabSize > model.vocabSize)
      throw new SlmError(
        'TOKENIZER_MISSING',
        `the tokenizer of ${dir} has ${tokenizer.vocabSize} ids but the model only ${model.vocabSize} embedding rows: give the folder its own tokenizer.json that matches config.json's vocab_size.`,
      );
    model.setVocab(tokenizer.tokenBytes());
    const chat = ChatFormatter.forModel(dir);
    return { model, tokenizer, chat, dispose: () => model.dispose() };
  } catch (e) {
    model.dispose();
    throw e;
  }
}
