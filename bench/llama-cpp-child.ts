/**
 * llama.cpp through node-llama-cpp's prebuilt binaries (CPU only, never built here), in a process of
 * its own (bench/llama-cpp.ts spawns it). Prints one JSON line.
 *
 * argv[2] is a JSON request:
 *  - {mode: 'bench', gguf, threads, prefill, steps, reps, batches}: a batch-1 prefill of `prefill`
 *    tokens (the median of `reps`), and for each B in `batches`, B sequences in one context each
 *    holding its 32-token prompt, then `steps` greedy decode steps all B sequences together (llama.cpp
 *    batches the B pending tokens into one decode); the prompts are bench/engine.ts's;
 *  - {mode: 'greedy', gguf, threads, prompt, n, logitsOut?}: the greedy continuation (temperature 0)
 *    of `prompt`, n tokens, and, with logitsOut, the raw logits after every prompt position written
 *    there as float32 [positions][vocab] (for the conversion test).
 */
import { writeFileSync } from 'node:fs';
import type { Token } from 'node-llama-cpp';
import { median } from './stats.js';

interface Req {
  mode: 'bench' | 'greedy';
  gguf: string;
  threads: number;
  prefill?: number;
  steps?: number;
  reps?: number;
  batches?: number[];
  prompt?: number[];
  n?: number;
  logitsOut?: string;
  flashAttention?: boolean;
}

const req = JSON.parse(process.argv[2]) as Req;
const { getLlama, LlamaLogLevel } = await import('node-llama-cpp');
const llama = await getLlama({
  gpu: false,
  build: 'never',
  skipDownload: true,
  logLevel: LlamaLogLevel.error,
  maxThreads: req.threads,
  progressLogs: false,
});
const model = await llama.loadModel({ modelPath: req.gguf, gpuLayers: 0 });
// The KV cache in float32 like slm-train's float32 rows (llama.cpp's default is F16). Flash attention:
// llama.cpp's default ('auto', on for the CPU) unless the request says; its CPU path rounds through
// float16 (the tiny preset's logits: 3.6e-4 from a float64 reference with it, 1.7e-7 without).
const kv = {
  experimentalKvCacheKeyType: 'F32',
  experimentalKvCacheValueType: 'F32',
  flashAttention: req.flashAttention ?? 'auto',
} as const;
const toks = (xs: number[]) => xs as Token[];
const out: Record<string, unknown> = {
  threads: req.threads,
  build: llama.buildType,
  release: llama.llamaCppRelease.release,
  system_info: llama.systemInfo,
  flash_attention: String(req.flashAttention ?? 'auto'),
  kv_cache: 'F32',
};

if (req.mode === 'greedy') {
  const ctx = await model.createContext({ sequences: 1, contextSize: 512, batchSize: 512, threads: req.threads, ...kv });
  const seq = ctx.getSequence();
  const prompt = toks(req.prompt!);
  if (req.logitsOut) {
    // The raw logits after every prompt position, [positions][vocab] float32, into a file.
    const res = await seq.controlledEvaluate(
      prompt.map((t) => [t, { generateNext: { logits: true } }] as [Token, { generateNext: { logits: true } }]),
    );
    const V = res[0]!.next!.logits!.size; // every token of the vocabulary
    const buf = new Float32Array(prompt.length * V);
    res.forEach((r, p) => {
      for (const [t, v] of r!.next!.logits!) buf[p * V + (t as number)] = v;
    });
    writeFileSync(req.logitsOut, buf);
    out.vocab = V;
    await seq.clearHistory();
  }
  const tokens: number[] = [];
  for await (const t of seq.evaluate(prompt, { temperature: 0 })) {
    tokens.push(t as number);
    if (tokens.length >= req.n!) break;
  }
  out.tokens = tokens;
  await ctx.dispose();
} else {
  const P = req.prefill!;
  const prompt = Array.from({ length: P }, (_, i) => ((i * 7919) % 100000) + 100);
  const pctx = await model.createContext({ sequences: 1, contextSize: Math.max(1024, 2 * P), batchSize: P, threads: req.threads, ...kv });
  const pseq = pctx.getSequence();
  await pseq.evaluateWithoutGeneratingNewTokens(toks(prompt.slice(0, 16))); // warm-up
  const pre: number[] = [];
  for (let r = 0; r < req.reps!; r++) {
    await pseq.clearHistory();
    const t0 = performance.now();
    await pseq.evaluateWithoutGeneratingNewTokens(toks(prompt));
    pre.push((performance.now() - t0) / 1e3);
  }
  await pctx.dispose();
  out.prefill = { tokens: P, seconds: median(pre), tokens_per_s: P / median(pre) };
  const decode: Array<{ batch: number; step_ms: number; tokens_per_s: number; steps: number }> = [];
  const S = req.steps!;
  for (const B of req.batches!) {
    const ctx = await model.createContext({ sequences: B, contextSize: B * 256, batchSize: 512, threads: req.threads, ...kv });
    const times: number[] = [];
    const seqs = Array.from({ length: B }, () => ctx.getSequence());
    for (let r = 0; r < req.reps!; r++) {
      await Promise.all(seqs.map((s) => s.clearHistory()));
      const prompts = Array.from({ length: B }, (_, b) => Array.from({ length: 32 }, (_, i) => (((b * 131 + i) * 7919) % 100000) + 100));
      await Promise.all(seqs.map((s, b) => s.evaluateWithoutGeneratingNewTokens(toks(prompts[b].slice(0, 31)))));
      const t0 = performance.now();
      // Each sequence's first new token needs one decode of its last prompt token: S tokens = S steps.
      await Promise.all(
        seqs.map(async (s, b) => {
          let n = 0;
          for await (const _ of s.evaluate(toks(prompts[b].slice(31)), { temperature: 0 })) if (++n >= S) break;
        }),
      );
      times.push((performance.now() - t0) / 1e3 / S);
    }
    const stepS = median(times);
    decode.push({ batch: B, step_ms: stepS * 1e3, tokens_per_s: B / stepS, steps: S });
    await ctx.dispose();
  }
  out.decode = decode;
}
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + '\n');
