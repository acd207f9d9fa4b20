// The independent float64 reference (test/reference/forward.py, run by a python with torch).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { repoRoot } from './shared.js';

/** A python with torch: Debian's /usr/bin/python3 first (CI installs python3-torch), then python3 on PATH. */
export function torchPython(): string | undefined {
  for (const p of [process.env.SLM_TORCH_PYTHON, '/usr/bin/python3', 'python3'])
    if (p && spawnSync(p, ['-c', 'import torch'], { encoding: 'utf8' }).status === 0) return p;
  return undefined;
}

export const NO_TORCH_PYTHON =
  "no python with torch for the float64 reference (tried $SLM_TORCH_PYTHON, /usr/bin/python3, python3): install Debian's python3-torch (apt-get install python3-torch)";

export interface RefCase {
  input_ids: number[][];
  attention_mask: number[][];
  position_ids: number[][];
}
export interface RefRequest {
  model_dir: string;
  adapter_dir?: string | null;
  cases?: RefCase[];
  greedy?: Array<{ prompt: number[]; steps: number }>;
  sft_grad?: { ids: number[]; mask: number[] };
}
export interface RefReply {
  cases: Array<{ logits: Array<Array<number[] | null>> }>;
  greedy: Array<{ tokens: number[]; margins: number[] }>;
  sft_grad?: { loss: number; grads: Record<string, number[]> };
}

export function runReference(python: string, req: RefRequest): RefReply {
  const r = spawnSync(python, [join(repoRoot, 'test', 'reference', 'forward.py')], {
    input: JSON.stringify(req),
    encoding: 'utf8',
    maxBuffer: 1 << 28,
  });
  if (r.status !== 0) throw new Error(`reference forward failed (${python}): ${r.stderr || r.error}`);
  return JSON.parse(r.stdout);
}

/** Max |engine - reference| over the unpadded positions, and how many argmaxes differ. */
export function compareLogits(
  ref: Array<Array<number[] | null>>,
  data: Float32Array,
  vocab: number,
): { diff: number; argmaxMismatches: number; positions: number } {
  let diff = 0,
    argmaxMismatches = 0,
    positions = 0;
  const T = ref[0].length;
  ref.forEach((row, b) =>
    row.forEach((r, t) => {
      if (!r) return;
      positions++;
      let best = 0,
        refBest = 0;
      for (let v = 0; v < vocab; v++) {
        const x = data[(b * T + t) * vocab + v];
        diff = Math.max(diff, Math.abs(x - r[v]));
        if (x > data[(b * T + t) * vocab + best]) best = v;
        if (r[v] > r[refBest]) refBest = v;
      }
      if (best !== refBest) argmaxMismatches++;
    }),
  );
  return { diff, argmaxMismatches, positions };
}
