// The optimizer half of a training step (gradient norm, clipping, AdamW with decoupled weight decay
// and bias correction) against torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW, over several
// steps with a changing learning rate, under the Python with torch that the other reference tests use.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { NO_TORCH_PYTHON, torchPython } from './helpers/reference.js';
import { needs } from './helpers/shared.js';

const python = torchPython();
const dir = mkdtempSync(join(tmpdir(), 'slm-adamw-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));

// Python: the same start, the same gradients, clip_grad_norm_ then AdamW.step, one param group whose lr
// changes per step. Prints the parameters after every step and the norm clip_grad_norm_ returned.
const TORCH = `
import json, sys, torch
req = json.load(sys.stdin)
names = list(req["init"].keys())
params = [torch.nn.Parameter(torch.tensor(req["init"][k], dtype=torch.float32)) for k in names]
o = req["opt"]
opt = torch.optim.AdamW(params, lr=req["steps"][0]["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], weight_decay=o["weightDecay"])
out = []
for s in req["steps"]:
    for p, k in zip(params, names):
        p.grad = torch.tensor(s["grads"][k], dtype=torch.float32)
    norm = torch.nn.utils.clip_grad_norm_(params, o["maxGradNorm"]).item()
    for g in opt.param_groups:
        g["lr"] = s["lr"]
    opt.step()
    out.append({"norm": norm, "params": {k: p.detach().tolist() for k, p in zip(names, params)}})
print(json.dumps(out))
`;

t.test(
  'clipping + AdamW equal torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW over 5 steps',
  { skip: needs(python ? false : NO_TORCH_PYTHON, t) },
  async (t) => {
    initModel({ preset: 'tiny', out: dir, seed: 11 });
    const model = await Model.load(dir);
    t.teardown(() => model.dispose());
    model.attachLora({ r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj'] } as never, 3);
    const init: Record<string, number[]> = {};
    for (const [k, v] of Object.entries(model.trainable())) {
      // lora_B away from 0 so that weight decay acts on every tensor
      const w = k.includes('lora_B') ? Float32Array.from(v, (_, i) => 0.03 * Math.sin(i * 0.7 + k.length)) : v;
      model.setTrainable(k, w);
      init[k] = Array.from(w);
    }
    const names = Object.keys(init);
    const sizes = names.map((k) => init[k].length);
    const total = sizes.reduce((a, b) => a + b, 0);
    const opt = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, maxGradNorm: 1 };
    // Gradients whose norm is above the clip on steps 1, 3 and 5 (scale 3) and below it on 2 and 4.
    const steps = [3, 0.05, 3, 0.02, 3].map((scale, s) => {
      const flat = new Float32Array(total);
      for (let i = 0; i < total; i++) flat[i] = (scale / Math.sqrt(total)) * Math.sin(i * 1.7 + s * 0.31) * 1.4;
      const grads: Record<string, number[]> = {};
      let o = 0;
      names.forEach((k, j) => ((grads[k] = Array.from(flat.subarray(o, o + sizes[j]))), (o += sizes[j])));
      return { flat, grads, lr: [1e-2, 2e-2, 5e-3, 1e-2, 3e-2][s] };
    });
    const r = spawnSync(python as string, ['-c', TORCH], {
      input: JSON.stringify({ init, opt, steps: steps.map((s) => ({ grads: s.grads, lr: s.lr })) }),
      encoding: 'utf8',
      maxBuffer: 1 << 28,
    });
    t.equal(r.status, 0, `torch ran${r.status ? `: ${r.stderr}` : ''}`);
    const ref = JSON.parse(r.stdout) as Array<{ norm: number; params: Record<string, number[]> }>;
    let clipped = 0;
    for (const [s, step] of steps.entries()) {
      const applied = await model.applyGradients({ lr: step.lr, ...opt }, step.flat);
      t.notOk(applied.skipped, `step ${s + 1} applied`);
      t.ok(
        Math.abs(applied.gradNorm - ref[s].norm) <= 1e-5 * ref[s].norm,
        `step ${s + 1}: gradient norm ${applied.gradNorm} = torch's ${ref[s].norm}`,
      );
      if (ref[s].norm > opt.maxGradNorm) clipped++;
      const got = model.trainable();
      let diff = 0;
      let moved = 0;
      for (const k of names)
        for (let i = 0; i < got[k].length; i++) {
          diff = Math.max(diff, Math.abs(got[k][i] - ref[s].params[k][i]));
          moved = Math.max(moved, Math.abs(got[k][i] - init[k][i]));
        }
      t.ok(moved > 1e-3, `step ${s + 1}: the parameters moved (${moved})`);
      t.ok(diff <= 2e-6, `step ${s + 1}: parameters equal torch's within 2e-6 (max |diff| ${diff})`);
    }
    t.equal(clipped, 3, 'three of the five steps were clipped, two were not');
  },
);
