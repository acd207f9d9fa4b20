/**
 * The old policy's log-probs that the clipped ratio of a policy-gradient update divides by
 * (algorithm.old_logprobs), for the episodes of one rollout batch:
 * - `sampler`: the log-probs the generator reported while sampling. Tokens the runner prefilled
 *   (protocol.prefill_*) and the loss covers (protocol.prefill_trained) were not sampled and have
 *   none: those alone are computed as `recompute` computes them.
 * - `recompute`: every trained token's log-prob from one teacher-forced forward of the policy as it
 *   is now (the adapter that sampled, before the update), at the temperature the training forward
 *   scores the episode with (`lossTemperature` when set, else its own; greedy rows at 1). That forward and the training forward are
 *   the same ATen computation, so with lora.dropout 0 the first inner epoch's ratio is exactly 1 (the
 *   reference code-search system's loss has no ratio at all); with dropout the training forward
 *   drops LoRA inputs that this forward keeps, and the ratio is 1 only on average.
 * - `forward`: none here; the native training forward uses its own log-probs, detached, as the old
 *   ones (oldFromForward): the ratio is exactly 1 under whatever dropout mask it draws, the gradient
 *   -A grad log p, as the reference code-search system's loss (one pass on fresh samples).
 */
import type { Model } from '../../engine/model.js';
import type { TrainEpisode } from '../types.js';

export type OldLogprobsMode = 'sampler' | 'recompute' | 'forward';

/** The episodes with their old log-probs as `mode` says (the same objects where nothing changes). */
export async function withOldLogprobs<E extends TrainEpisode>(model: Model, episodes: E[], mode: OldLogprobsMode): Promise<E[]> {
  // 'forward': the training forward takes its own log-probs (detached) as the old ones; nothing to add.
  if (!episodes.length || mode === 'forward') return episodes;
  if (mode === 'recompute') {
    const lps = await model.sequenceLogprobs(
      episodes.map((e) => e.ids),
      episodes.map(scoringTemperature),
      episodes.map((e) => e.lossMask),
    );
    return episodes.map((e, i) => ({ ...e, logprobs: lps[i] }));
  }
  // The trained prefilled tokens: the only ones the sampler has no log-prob for.
  const need = episodes.map((_e, i) => i).filter((i) => episodes[i].forced?.some((f, t) => f === 1 && episodes[i].lossMask[t] === 1));
  if (!need.length) return episodes;
  const masks = need.map((i) => Uint8Array.from(episodes[i].forced!, (f, t) => (f === 1 && episodes[i].lossMask[t] === 1 ? 1 : 0)));
  const lps = await model.sequenceLogprobs(
    need.map((i) => episodes[i].ids),
    need.map((i) => scoringTemperature(episodes[i])),
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

/** The temperature the training forward scores an episode at: lossTemperature, else its own (greedy rows at 1). */
export function scoringTemperature(e: Pick<TrainEpisode, 'temperature' | 'lossTemperature'>): number {
  const t = e.lossTemperature ?? e.temperature;
  return t > 0 ? t : 1;
}
