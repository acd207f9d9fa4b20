/**
 * LoRA training-step benchmark on the `small` preset: tokens/s of one optimizer step (forward,
 * backward, AdamW) at sequence 512 with and without per-layer gradient checkpointing, achieved
 * FLOP/s as a fraction of the matmul rate measured in the same run, and peak memory of each.
 *
 * Useful FLOPs per step = 4 x (layer matmul parameters x tokens + vocab head parameters x head rows)
 * + 3 x causal attention's forward FLOPs: the forward (2) and the backward to the activations (2)
 * through every projection, and through the vocabulary head for the positions it projects — the
 * trained ones (the batch trains the last 3/4 of its tokens, a prompt before them; the prompt's
 * positions need no logits and get none); attention's forward (QK^T, PV) and its backward to Q, K
 * and V (twice the forward). LoRA's own weight gradients are negligible. Checkpointing recomputes
 * the forward, counted as overhead, not as work.
 * Each configuration runs in a child process (bench/train-child.ts) so that its peak resident memory
 * (VmHWM) is its own; the table gives it and its growth over the loaded model. With PyTorch 2 + PEFT
 * at hand, their step (bench/peft_step.py) runs in rounds alternated with slm-train's (3 rounds, one
 * under --quick): each side's figure is the median of its rounds, the speedup the median of the
 * rounds' own ratios, their range beside it. Each process runs 2 warm-up steps and gives the median of
 * the next 4 (1 and 1 under --quick).
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Model } from '../lib/engine/model.js';
import { SlmError } from '../lib/errors.js';
import { attentionFlops, benchModelDir, layerMatmulParams, MachineLimits } from './engine.js';
import { median } from './stats.js';
import type { BenchOptions, BenchReport } from './types.js';

export async function runBench(opts: BenchOptions = {}): Promise<BenchReport> {
  const log = opts.log ?? (() => {});
  const quick = !!opts.quick;
  const dir = opts.model ?? (await benchModelDir('small', log));
  const m = await Model.load(dir);
  const cfg = m.config;
  const info = m.info();
  const H = cfg.hidden_size,
    V = cfg.vocab_size;
  const layerParams = layerMatmulParams(info.numParameters, cfg);
  m.dispose();
  log('train: measuring the matmul rate');
  const lim = await MachineLimits.measure(['f32'], quick ? 0.3 : 1);
  const T = quick ? 256 : 512;
  const child = fileURLToPath(new URL('./train-child.js', import.meta.url));
  // The peer: the same step in PyTorch 2 + transformers + PEFT, where a python with them is at hand
  // (SLM_TRAIN_HF_PYTHON, or .venv/bin/python from scripts/setup-venv.sh), each configuration in its own process.
  const py = peftPython();
  if (!py) log('train: no python with torch 2, transformers and peft (bash scripts/setup-venv.sh): the PEFT rows are left out');
  const script = fileURLToPath(new URL('../../bench/peft_step.py', import.meta.url));
  // Rounds, each running every configuration once, slm-train's and the peer's alternated: a shared
  // machine's speed moves by tens of percent over minutes (this one's did between runs of the same
  // child), and measured one after the other the two sides' ratio moved with it (1.29x to 1.63x
  // between runs). Each side's figure is the median over the rounds, the ratio the median of the
  // rounds' own ratios, with their range beside it.
  const rounds = quick ? 1 : 3;
  // Per process: warm-up steps, not timed, then the median of the timed ones: a training run is made
  // of the later steps. Here (2-core Zen 4, 2026-11-27) slm-train's second and third steps took
  // 1.05-1.3x its later ones; PEFT's first took 2.6x its later ones and its second and third no longer.
  const [warmup, reps] = quick ? [1, 1] : [2, 4];
  const runs: Record<'off' | 'on', OwnRun[]> = { off: [], on: [] };
  const peers: Record<'off' | 'on', PeerRun[]> = { off: [], on: [] };
  for (let round = 0; round < rounds; round++)
    for (const checkpoint of [false, true]) {
      const key = checkpoint ? 'on' : 'off';
      const of = `round ${round + 1} of ${rounds}`;
      log(`train: sequence ${T}, checkpointing ${key} (own process, ${of})`);
      const r = spawnSync(process.execPath, [child, dir, checkpoint ? '1' : '0', String(T), String(reps), String(warmup)], {
        encoding: 'utf8',
        timeout: 600_000,
      });
      if (r.status !== 0)
        throw new SlmError('NATIVE_ERROR', `the train benchmark child failed: ${r.stderr.trim().split('\n').slice(-3).join(' ')}`);
      runs[key].push(JSON.parse(r.stdout.trim().split('\n').pop()!) as OwnRun);
      if (!py) continue;
      log(`train: PyTorch 2 + PEFT, sequence ${T}, checkpointing ${key} (own process, ${of})`);
      const q = spawnSync(
        py,
        [script, dir, checkpoint ? '1' : '0', String(T), String(reps), String(availableParallelism()), String(warmup)],
        {
          encoding: 'utf8',
          timeout: 900_000,
        },
      );
      if (q.status !== 0)
        throw new SlmError(
          'NATIVE_ERROR',
          `the PEFT peer of the train benchmark failed: ${q.stderr.trim().split('\n').slice(-3).join(' ')}`,
        );
      peers[key].push(JSON.parse(q.stdout.trim().split('\n').pop()!) as PeerRun);
    }
  // One GRPO step on the same model and batch: slm-train through its library (bench/grpo-child.ts) and,
  // where TRL is installed, TRL's GRPOTrainer (bench/trl_grpo.py): K rollouts of one prompt + one update.
  const grpo = await grpoRows(dir, quick, py, log);
  log('train: measuring the matmul rate again');
  await lim.again();
  const gflops = lim.v.f32;
  const rows = (['off', 'on'] as const).map((key) => {
    const c = combineRounds(runs[key]);
    const flops = 4 * (layerParams * T + V * H * c.head_rows) + 3 * attentionFlops(cfg, T);
    return {
      checkpointing: key === 'on',
      seq_len: T,
      head_rows: c.head_rows,
      rounds: runs[key].length,
      step_s: +c.step_s.toFixed(3),
      step_s_rounds: runs[key].map((r) => +r.step_s.toFixed(3)),
      tokens_per_s: +(T / c.step_s).toFixed(1),
      achieved_GFLOPs: +(flops / c.step_s / 1e9).toFixed(1),
      fraction_of_matmul_rate: +(flops / c.step_s / 1e9 / gflops).toFixed(3),
      peak_rss_MiB: Math.round(c.peak_MiB),
      peak_above_loaded_MiB: Math.round(c.peak_MiB - c.loaded_MiB),
    };
  });
  const peerRows = (['off', 'on'] as const)
    .filter((key) => peers[key].length > 0)
    .map((key) => {
      const p = combineRounds(peers[key]);
      const ratio = roundRatios(peers[key], runs[key]);
      const flops = 4 * (layerParams * T + V * H * (T - 1)) + 3 * attentionFlops(cfg, T); // transformers projects every position
      return {
        checkpointing: key === 'on',
        torch: peers[key][0].torch,
        rounds: peers[key].length,
        step_s: +p.step_s.toFixed(3),
        step_s_rounds: peers[key].map((r) => +r.step_s.toFixed(3)),
        tokens_per_s: +(T / p.step_s).toFixed(1),
        achieved_GFLOPs: +(flops / p.step_s / 1e9).toFixed(1),
        peak_rss_MiB: Math.round(p.peak_MiB),
        peak_above_loaded_MiB: Math.round(p.peak_MiB - p.loaded_MiB),
        slm_train_speedup: +ratio.median.toFixed(2),
        slm_train_speedup_range: [+ratio.min.toFixed(2), +ratio.max.toFixed(2)],
      };
    });
  const results = {
    model: { dir, parameters: info.numParameters, lora: 'r16 on all projections' },
    machine: { matmul_f32_GFLOPs: +gflops.toFixed(1) },
    steps: rows,
    peft: peerRows,
    grpo,
  };
  const table = [
    `| LoRA train step (small preset, seq ${T}, the last 3/4 trained) | tokens/s | vocab head rows | achieved GFLOP/s (fraction of ${gflops.toFixed(0)} GFLOP/s matmul) | peak RSS (above the loaded model) |`,
    '|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| checkpointing ${r.checkpointing ? 'on' : 'off'} | ${r.tokens_per_s} | ${r.head_rows} of ${T - 1} | ${r.achieved_GFLOPs} (${r.fraction_of_matmul_rate}) | ${r.peak_rss_MiB} MiB (+${r.peak_above_loaded_MiB} MiB) |`,
    ),
    ...peerRows.map(
      (r) =>
        `| PyTorch ${r.torch} + PEFT, checkpointing ${r.checkpointing ? 'on' : 'off'} (slm-train ${r.slm_train_speedup}x as fast; ${r.rounds > 1 ? `${r.slm_train_speedup_range[0]}-${r.slm_train_speedup_range[1]}x over ${r.rounds} alternated rounds` : 'one round'}) | ${r.tokens_per_s} | ${T - 1} of ${T - 1} | ${r.achieved_GFLOPs} (${(r.achieved_GFLOPs / gflops).toFixed(3)}) | ${r.peak_rss_MiB} MiB (+${r.peak_above_loaded_MiB} MiB) |`,
    ),
    '',
    grpoTable(grpo),
  ].join('\n');
  return { kind: 'train', results, table };
}

interface OwnRun {
  step_s: number;
  head_rows: number;
  peak_MiB: number;
  loaded_MiB: number;
}
interface PeerRun {
  step_s: number;
  peak_MiB: number;
  loaded_MiB: number;
  torch: string;
}

/**
 * One configuration's rounds as one figure: the median step time, and the highest peak of resident
 * memory any round reached (with the loaded size of that round). Exported for the test.
 */
export function combineRounds<R extends { step_s: number; peak_MiB: number; loaded_MiB: number }>(rs: R[]): R {
  if (rs.length === 0) throw new SlmError('NATIVE_ERROR', 'combineRounds: no rounds');
  const top = rs.reduce((a, b) => (b.peak_MiB > a.peak_MiB ? b : a));
  return { ...top, step_s: median(rs.map((r) => r.step_s)) };
}

/** The peer's step time over slm-train's, round by round (round i of each side ran back to back): their median and range. */
export function roundRatios(peer: Array<{ step_s: number }>, own: Array<{ step_s: number }>): { median: number; min: number; max: number } {
  if (peer.length === 0 || peer.length !== own.length)
    throw new SlmError('NATIVE_ERROR', `roundRatios: ${peer.length} peer rounds against ${own.length} own`);
  const r = peer.map((p, i) => p.step_s / own[i].step_s);
  return { median: median(r), min: Math.min(...r), max: Math.max(...r) };
}

/** A python with torch 2, transformers and peft: $SLM_TRAIN_HF_PYTHON, or the checkout's .venv (scripts/setup-venv.sh). */
export function peftPython(): string | undefined {
  const venv = fileURLToPath(new URL('../../.venv/bin/python', import.meta.url));
  for (const p of [process.env.SLM_TRAIN_HF_PYTHON, venv, join(process.cwd(), '.venv', 'bin', 'python')])
    if (p && existsSync(p) && spawnSync(p, ['-c', 'import torch, transformers, peft'], { encoding: 'utf8' }).status === 0) return p;
  return undefined;
}

interface GrpoRun {
  step_s: number;
  generate_s: number;
  update_s: number;
  completion_tokens: number[];
  rows: number;
  prompt_tokens: number;
  peak_MiB: number;
  loaded_MiB: number;
  trl?: string;
  torch?: string;
}

/** The GRPO rows: slm-train's step, and TRL's (or why it is missing), each in a process of its own. */
async function grpoRows(
  dir: string,
  quick: boolean,
  py: string | undefined,
  log: (s: string) => void,
): Promise<{ slm_train: GrpoRun; trl?: GrpoRun; trl_missing?: string; slm_train_speedup?: number }> {
  const [P, C, K, reps] = quick ? [16, 16, 4, 1] : [64, 64, 8, 2];
  const parse = (r: ReturnType<typeof spawnSync>, what: string): GrpoRun => {
    if (r.status !== 0) throw new SlmError('NATIVE_ERROR', `${what} failed: ${String(r.stderr).trim().split('\n').slice(-3).join(' ')}`);
    return JSON.parse(String(r.stdout).trim().split('\n').pop()!) as GrpoRun;
  };
  const args = [dir, String(P), String(C), String(K), String(reps)];
  log(`train: a GRPO step, ${K} rollouts of a ${P}-token prompt x ${C} new tokens + one update (own process)`);
  const slm_train = parse(
    spawnSync(process.execPath, [fileURLToPath(new URL('./grpo-child.js', import.meta.url)), ...args], {
      encoding: 'utf8',
      timeout: 900_000,
    }),
    'the GRPO step of the train benchmark',
  );
  const trl_missing = trlMissing(py);
  if (trl_missing) {
    log(`train: ${trl_missing}: the TRL row is left out`);
    return { slm_train, trl_missing };
  }
  log('train: the same GRPO step in TRL GRPOTrainer (own process)');
  const script = fileURLToPath(new URL('../../bench/trl_grpo.py', import.meta.url));
  const trl = parse(
    spawnSync(py!, [script, ...args, String(availableParallelism())], { encoding: 'utf8', timeout: 1_800_000 }),
    'the TRL peer of the train benchmark',
  );
  return { slm_train, trl, slm_train_speedup: +(trl.step_s / slm_train.step_s).toFixed(2) };
}

/** Why TRL's GRPO row cannot run (undefined: it can): no python with torch, transformers and peft, or no trl in it. */
export function trlMissing(py: string | undefined): string | undefined {
  if (!py) return 'no python with torch 2, transformers and peft (bash scripts/setup-venv.sh)';
  if (spawnSync(py, ['-c', 'import trl, datasets'], { encoding: 'utf8' }).status !== 0)
    return `no trl in ${py} (bash scripts/setup-venv.sh installs it)`;
  return undefined;
}

function grpoTable(g: Awaited<ReturnType<typeof grpoRows>>): string {
  const s = g.slm_train;
  const row = (name: string, r: GrpoRun) =>
    `| ${name} | ${r.step_s.toFixed(2)} | ${r.generate_s.toFixed(2)} | ${r.update_s.toFixed(2)} | ${Math.round(r.peak_MiB)} MiB (+${Math.round(r.peak_MiB - r.loaded_MiB)} MiB) |`;
  return [
    `| GRPO step (${s.rows} rollouts of a ${s.prompt_tokens}-token prompt x ${s.completion_tokens.join('/')} new tokens, one update, checkpointing on) | step s | generation s | update s | peak RSS (above the loaded model) |`,
    '|---|---|---|---|---|',
    row('slm-train', s),
    g.trl
      ? row(`TRL ${g.trl.trl} GRPOTrainer, PyTorch ${g.trl.torch} (slm-train ${g.slm_train_speedup}x as fast)`, g.trl)
      : `| TRL GRPOTrainer: left out (${g.trl_missing}) | | | | |`,
  ].join('\n');
}
