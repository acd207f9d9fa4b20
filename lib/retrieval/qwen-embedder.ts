/**
 * Qwen3 embedding checkpoints (Qwen3-Embedding-0.6B/4B/8B, or any Qwen3 folder) as an Embedder, run
 * by the native engine: the model's own tokenizer with its post-processor (which appends the end
 * token these checkpoints pool on), last-token pooling of the final hidden state, L2 normalisation;
 * queries get the instruction prefix of the Qwen3-Embedding model card
 * (`Instruct: {task}\nQuery:{query}`), documents none.
 */
import { resolve } from 'node:path';
import { Model } from '../engine/model.js';
import { loadTokenizer, type HfTokenizer } from '../model/tokenizer.js';
import type { Embedder } from './embedders.js';

export const DEFAULT_TASK = 'Given a web search query, retrieve relevant passages that answer the query';

export class QwenEmbedder implements Embedder {
  readonly name: string;
  readonly dim: number;
  private constructor(
    readonly dir: string,
    private model: Model,
    private tok: HfTokenizer,
    readonly opts: { task: string; maxTokens: number; batch: number },
  ) {
    this.name = `qwen3:${dir}`;
    this.dim = model.config.hidden_size;
  }

  static async load(dir: string, opts: { task?: string; maxTokens?: number; batch?: number; device?: string } = {}): Promise<QwenEmbedder> {
    const abs = resolve(dir);
    const model = await Model.load(abs, { device: opts.device ?? 'cpu' });
    try {
      return new QwenEmbedder(abs, model, loadTokenizer(abs), {
        task: opts.task ?? DEFAULT_TASK,
        maxTokens: opts.maxTokens ?? 512,
        batch: opts.batch ?? 16,
      });
    } catch (e) {
      model.dispose();
      throw e;
    }
  }

  /** The text a query is embedded as. */
  queryText(query: string): string {
    return `Instruct: ${this.opts.task}\nQuery:${query}`;
  }

  async embed(texts: string[], kind: 'query' | 'document'): Promise<Float32Array[]> {
    const ids = texts.map((t) => {
      const e = this.tok.encode(kind === 'query' ? this.queryText(t) : t, { addSpecialTokens: true });
      // Keep the end (the pooled token is the last one).
      return e.length > this.opts.maxTokens
        ? e.slice(e.length - this.opts.maxTokens)
        : e.length
          ? e
          : this.tok.encode(' ', { addSpecialTokens: true });
    });
    const out: Float32Array[] = new Array(texts.length);
    // Similar lengths together: less padding per forward.
    const order = ids.map((_, i) => i).sort((a, b) => ids[a].length - ids[b].length);
    for (let s = 0; s < order.length; s += this.opts.batch) {
      const part = order.slice(s, s + this.opts.batch);
      const h = await this.model.lastHidden(part.map((i) => ids[i]));
      part.forEach((i, j) => {
        const v = h[j];
        let n = 0;
        for (const x of v) n += x * x;
        n = Math.sqrt(n) || 1;
        for (let k = 0; k < v.length; k++) v[k] /= n;
        out[i] = v;
      });
    }
    return out;
  }

  dispose(): void {
    this.model.dispose();
  }
}
