/**
 * The server of `slm-train bench serve` in a process of its own (bench/serve.ts starts it), so that
 * the load-testing clients' event loop does not share the server's: `slm-train serve`'s
 * OpenAIServer over the model folder (loaded as `serve` loads it: loadPolicy, the default dtype and
 * thread count), on 127.0.0.1, port 0. argv[2]: JSON { dir, maxBatch }. Over the IPC channel it
 * sends { ready: { port, threads, dtype, parameters } } once listening, then answers requests
 * { id, cmd } with { id, ... } or { id, error }:
 *  - limit { batches, steps, reps, promptTokens }: the engine's decode rate at each batch, measured
 *    here, on the same model and threads, with no request running (Model.generate as `bench engine`
 *    measures it: B rows of promptTokens-token prompts, temperature 1, median over reps of the
 *    decode time per step after the first);
 *  - stats { since }: once no request runs, the decode sessions that ended after the first `since`
 *    (server.sessions) and their count;
 *  - quit: closes the server, frees the model and exits.
 * It exits when its parent goes away (the IPC channel closes).
 */
import { loadPolicy } from '../lib/engine/policy.js';
import { native } from '../lib/engine/runtime.js';
import { OpenAIServer } from '../lib/serve/server.js';
import { median } from './stats.js';

interface Request {
  id: number;
  cmd: 'limit' | 'stats' | 'quit';
  batches?: number[];
  steps?: number;
  reps?: number;
  promptTokens?: number;
  since?: number;
}

/** The prompts `bench engine` decodes: B rows of T token ids, distinct per row. */
function decodePrompts(B: number, T: number): Int32Array[] {
  return Array.from({ length: B }, (_, b) => Int32Array.from({ length: T }, (_, i) => (((b * 131 + i) * 7919) % 100000) + 100));
}

const cfg = JSON.parse(process.argv[2]) as { dir: string; maxBatch: number };
const { model, tokenizer, formatter } = await loadPolicy(cfg.dir);
const server = new OpenAIServer({ model, tokenizer, formatter, name: 'bench', port: 0, host: '127.0.0.1', maxBatch: cfg.maxBatch });
const port = await server.listen();
const send = (m: unknown) => process.send?.(m);

async function decodeRate(B: number, steps: number, reps: number, T: number) {
  const prompts = decodePrompts(B, T);
  const perStep: number[] = [];
  for (let r = 0; r < reps; r++) {
    const g = await model.generate({ prompts, maxNewTokens: steps, temperature: 1, topK: 0, seed: r });
    // Rows never stop early (no stop ids): every step decodes all B rows; the first token is the prefill's.
    perStep.push(g.decodeSeconds / Math.max(1, g.steps - 1));
  }
  const s = median(perStep);
  return { batch: B, step_ms: s * 1e3, tokens_per_s: B / s };
}

async function answer(q: Request): Promise<Record<string, unknown>> {
  if (q.cmd === 'limit') {
    await server.idle();
    await model.generate({ prompts: decodePrompts(1, 16), maxNewTokens: 2, greedy: true }); // warm-up
    const rates = [];
    for (const B of q.batches ?? [1, 16]) rates.push(await decodeRate(B, q.steps ?? 48, q.reps ?? 3, q.promptTokens ?? 32));
    return { rates };
  }
  if (q.cmd === 'stats') {
    await server.idle();
    return { count: server.sessions.count, sessions: server.sessions.since(q.since ?? 0) };
  }
  await server.close();
  await server.idle();
  model.dispose();
  return {};
}

process.on('message', (q: Request) => {
  answer(q).then(
    (r) => {
      send({ id: q.id, ...r });
      if (q.cmd === 'quit') process.disconnect();
    },
    (e: Error) => send({ id: q.id, error: e.stack ?? e.message }),
  );
});
process.on('disconnect', () => process.exit(0));
const info = model.info();
const dtype = ({ Float: 'float32', BFloat16: 'bfloat16', Half: 'float16' } as Record<string, string>)[info.dtype] ?? info.dtype;
send({
  ready: { port, threads: native().version().threads, dtype, parameters: info.numParameters, cpuCache: native().version().cpuCache },
});
