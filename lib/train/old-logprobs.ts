/**
 * The old policy's log-probs that the clipped ratio of a policy-gradient update divides by
 * (algorithm.old_logprobs), for the episodes of one rollout batch:
 * - `sampler`: the log-probs the generator reported while sampling. Tokens the runner prefilled
 *   (protocol.prefill_*) and the loss covers (protocol.prefill_trained) were not sampled and have
 *   none: those alone are computed as `recompute` computes them.
 * - `recompute`: every trained token's log-prob from one teacher-forced forward of the policy as it
 *   is now (the adapter that sampled, before the update), at the temperature the training forward
 *   scores the episode with (its own; greedy rows at 1). That forward and the training forward are
 *   the same ATen computation, so with lora.dropout 0 the first inner epoch's ratio is exactly 1 (the
 *   reference code-search system's loss has no ratio at all); with dropout the training forward
 *   drops LoRA inputs that this forward keeps, and the ratio is 1 only on average.
 */
import type { Model } from '../engine/model.js';
import { recomputeLogprobs } from '../engine/openai-rollout.js';
import type { TrainEpisode } from './types.js';

export type OldLogprobsMode = 'sampler' | 'recompute';

/** The episodes with their old log-probs as `mode` says (the same objects where nothing changes). */
export async function withOldLogprobs<E extends TrainEpisode>(model: Model, episodes: E[], mode: OldLogprobsMode): Promise<E[]> {
  if (!episodes.length) return episodes;
  if (mode === 'recompute') return recomputeLogprobs(model, episodes);
  // The trained prefilled tokens: the only ones the sampler has no log-prob for.
  const need = episodes.map((e, i) => i).filter((i) => episodes[i].forced?.some((f, t) => f === 1 && episodes[i].lossMask[t] === 1));
  if (!need.length) return episodes;
  const masks = need.map((i) => Uint8Array.from(episodes[i].forced!, (f, t) => (f === 1 && episodes[i].lossMask[t] === 1 ? 1 : 0)));
  const lps = await model.sequenceLogprobs(
    need.map((i) => episodes[i].ids),
    need.map((i) => (episodes[i].temperature > 0 ? episodes[i].temperature : 1)),
    masks,
  );
  const out = episodes.slice();
  need.forEach((i, j) => {
    const lp = Float32Array.from(episodes[i].logprobs);
    masks[j].forEach((m, t) => {
      if (m) lp[t] = lps[j][t];
    });
    out[i] = { ...episodes[i], logprobs: lp };
  });
  return out;
}
