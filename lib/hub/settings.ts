/**
 * The hub download settings, from the options or else the environment (as huggingface_hub reads
 * it): HF_ENDPOINT sets the hub, HF_TOKEN authenticates, HF_HUB_OFFLINE=1 never touches the
 * network, HF_HUB_ETAG_TIMEOUT (10 s) bounds waiting for an answer and HF_HUB_DOWNLOAD_TIMEOUT
 * (10 s) waiting for the next bytes of a file; HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME place the cache.
 */
import { homedir } from 'node:os';
import { join } from 'node:path';
import { SlmError } from '../errors.js';

export interface HubOptions {
  /** The hub's address (default: $HF_ENDPOINT, else https://huggingface.co). */
  endpoint?: string;
  /** Access token (default: $HF_TOKEN). */
  token?: string;
  /** The cache folder (default: $HF_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub). */
  cacheDir?: string;
  /** Never make a request (default: $HF_HUB_OFFLINE is 1/true/yes). */
  offline?: boolean;
  /** Seconds to wait for a response's headers (default: $HF_HUB_ETAG_TIMEOUT, else 10). */
  timeoutS?: number;
  /** Seconds without a byte before a download is abandoned and retried (default: $HF_HUB_DOWNLOAD_TIMEOUT, else 10). */
  stallS?: number;
  /** Tries per file before giving up (the partial file is kept for the next run). Default 5. */
  attempts?: number;
  /** Progress lines (default: stderr). */
  log?: (line: string) => void;
}

/** HubOptions with every default filled in. */
export interface Settings {
  endpoint: string;
  token?: string;
  cacheDir: string;
  offline: boolean;
  timeoutMs: number;
  stallMs: number;
  attempts: number;
  log: (line: string) => void;
}

const envNumber = (name: string, dflt: number) => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : dflt;
};

function hubCacheDir(): string {
  const env = process.env;
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  if (env.HF_HOME) return join(env.HF_HOME, 'hub');
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'huggingface', 'hub');
}

export function settings(opts: HubOptions): Settings {
  const token = opts.token ?? (process.env.HF_TOKEN || undefined);
  if (token !== undefined && !token.startsWith('hf_'))
    throw new SlmError(
      'HUB_AUTH_REQUIRED',
      `HF_TOKEN does not look like a Hugging Face access token (expected "hf_..." , found a value starting ${JSON.stringify(token.slice(0, 3))}). Create one at https://huggingface.co/settings/tokens, or unset HF_TOKEN for public repositories.`,
    );
  return {
    endpoint: (opts.endpoint ?? (process.env.HF_ENDPOINT || 'https://huggingface.co')).replace(/\/+$/, ''),
    token,
    cacheDir: opts.cacheDir ?? hubCacheDir(),
    offline: opts.offline ?? /^(1|true|yes|on)$/i.test(process.env.HF_HUB_OFFLINE ?? ''),
    timeoutMs: 1000 * (opts.timeoutS ?? envNumber('HF_HUB_ETAG_TIMEOUT', 10)),
    stallMs: 1000 * (opts.stallS ?? envNumber('HF_HUB_DOWNLOAD_TIMEOUT', 10)),
    attempts: Math.max(1, opts.attempts ?? 5),
    log: opts.log ?? ((s) => process.stderr.write(`[slm-train] ${s}\n`)),
  };
}
