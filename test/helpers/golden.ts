import { readFileSync } from 'node:fs';
import { fixture } from './shared.js';

export interface GoldenCase {
  name: string;
  input_ids: number[][];
  attention_mask: number[][];
  position_ids: number[][];
  logits_shape: [number, number, number];
  argmax: Array<Array<number | null>>;
  logits: Array<Array<number[] | null>>;
}
export interface GoldenModel {
  model_dir: string;
  adapter_dir: string | null;
  cases: GoldenCase[];
  greedy: { prompt: number[]; steps: number; tokens: number[]; top1_minus_top2_logit: number[] };
}

export function readGolden(): { models: Record<string, GoldenModel> } {
  return JSON.parse(readFileSync(fixture('qwen3', 'golden.json'), 'utf8'));
}

/**
 * Max |a - b| over the non-null (unpadded) positions of a golden case, the argmax mismatches, and
 * those among the positions whose reference top-1/top-2 margin exceeds `wide` (where a bounded
 * rounding error cannot flip the argmax).
 */
export function maxAbsDiff(
  c: GoldenCase,
  data: Float32Array,
  wide = Infinity,
): { diff: number; argmaxMismatches: number; worstMargin: number; widePositions: number; wideMismatches: number } {
  const [B, T, V] = c.logits_shape;
  let diff = 0;
  let argmaxMismatches = 0;
  let worstMargin = Infinity;
  let widePositions = 0;
  let wideMismatches = 0;
  for (let b = 0; b < B; b++)
    for (let t = 0; t < T; t++) {
      const ref = c.logits[b][t];
      if (!ref) continue;
      let best = 0;
      for (let v = 0; v < V; v++) {
        const x = data[(b * T + t) * V + v];
        diff = Math.max(diff, Math.abs(x - ref[v]));
        if (x > data[(b * T + t) * V + best]) best = v;
      }
      if (best !== c.argmax[b][t]) argmaxMismatches++;
      const sorted = [...ref].sort((x, y) => y - x);
      worstMargin = Math.min(worstMargin, sorted[0] - sorted[1]);
      if (sorted[0] - sorted[1] > wide) {
        widePositions++;
        if (best !== c.argmax[b][t]) wideMismatches++;
      }
    }
  return { diff, argmaxMismatches, worstMargin, widePositions, wideMismatches };
}
