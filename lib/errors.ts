/**
 * The one error type of slm-train. Every failure a user can cause carries a stable string `code`
 * (scripts match on it) and a message that says what was expected, what was found and what to do.
 * The native addon throws this same class (it is handed over at load time), so errors from C++ are
 * catchable by code too.
 */
export type ErrorCode =
  | 'CONFIG_INVALID'
  | 'CONFIG_UNKNOWN_KEY'
  | 'ARGUMENT_INVALID'
  | 'FILE_NOT_FOUND'
  | 'HUB_NOT_FOUND'
  | 'HUB_AUTH_REQUIRED'
  | 'HUB_UNREACHABLE'
  | 'HUB_DOWNLOAD_FAILED'
  | 'HUB_CACHE_UNWRITABLE'
  | 'HUB_UPLOAD_FAILED'
  | 'TRACKING_FAILED'
  | 'MODEL_NOT_FOUND'
  | 'MODEL_CONFIG_INVALID'
  | 'MODEL_TYPE_UNSUPPORTED'
  | 'WEIGHTS_MISSING'
  | 'WEIGHTS_SHARD_MISSING'
  | 'WEIGHTS_CORRUPT'
  | 'WEIGHTS_MISMATCH'
  | 'WEIGHTS_UNUSED'
  | 'DTYPE_UNSUPPORTED'
  | 'DEVICE_UNAVAILABLE'
  | 'TOKEN_OUT_OF_RANGE'
  | 'TOKENIZER_MISSING'
  | 'CHAT_TEMPLATE_ERROR'
  | 'NATIVE_BINARY_MISSING'
  | 'NATIVE_ERROR'
  | 'HANDLE_DISPOSED'
  | 'MODEL_BUSY'
  | 'NOT_SUPPORTED'
  | 'CORPUS_INVALID'
  | 'INDEX_INVALID'
  | 'SANDBOX_TIMEOUT'
  | 'SANDBOX_ERROR'
  | 'SANDBOX_UNAVAILABLE'
  | 'SANDBOX_ISOLATION_INSUFFICIENT'
  | 'PROTOCOL_ERROR'
  | 'JUDGE_FAILED'
  | 'ADAPTER_NOT_FOUND'
  | 'ADAPTER_INVALID'
  | 'ADAPTER_MISMATCH'
  | 'ADAPTER_TARGET_UNKNOWN'
  | 'NO_TRAINABLE_PARAMETERS'
  | 'CHECKPOINT_INVALID'
  | 'RESUME_SCHEDULE_CHANGED'
  | 'TRAINING_DIVERGED'
  | 'OUT_OF_MEMORY'
  | 'DATA_INVALID'
  | 'NOT_FOUND'
  | 'RUN_EXISTS'
  | 'PORT_IN_USE'
  | 'RETRIEVER_UNAVAILABLE'
  | 'RETRIEVER_ERROR'
  | 'DISTRIBUTED_UNAVAILABLE'
  | 'DISTRIBUTED_FAILED'
  | 'ROLLOUT_SERVER_UNAVAILABLE'
  | 'ROLLOUT_SERVER_ERROR'
  | 'REWARD_MODULE_INVALID'
  | 'TOOLS_MODULE_INVALID';

export class SlmError extends Error {
  readonly code: ErrorCode | string;
  readonly details?: Record<string, unknown>;
  constructor(code: ErrorCode | string, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'SlmError';
    this.code = code;
    if (details) this.details = details;
  }
}

export function isSlmError(e: unknown): e is SlmError {
  return e instanceof SlmError || (e instanceof Error && typeof (e as { code?: unknown }).code === 'string' && e.name === 'SlmError');
}

/** Describe a value for "expected X but found Y" messages: `-1 (number)`, `"abc" (string)`. */
export function describe(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  if (typeof value === 'string') return `${JSON.stringify(value.length > 60 ? value.slice(0, 57) + '...' : value)} (string)`;
  if (Array.isArray(value)) return `an array of length ${value.length}`;
  if (typeof value === 'object') return `an object`;
  return `${String(value)} (${typeof value})`;
}

/** The closest candidate by edit distance, for "did you mean" hints; undefined when nothing is close. */
export function closest(word: string, candidates: Iterable<string>, maxDistance = 3): string | undefined {
  let best: string | undefined;
  let bestD = Infinity;
  for (const c of candidates) {
    const d = editDistance(word.toLowerCase(), c.toLowerCase());
    if (d < bestD) {
      bestD = d;
      best = c;
    }
  }
  return bestD <= Math.max(1, Math.min(maxDistance, Math.floor(word.length / 2))) ? best : undefined;
}

export function editDistance(a: string, b: string): number {
  const prev = new Array<number>(b.length + 1);
  for (let j = 0; j <= b.length; j++) prev[j] = j;
  for (let i = 1; i <= a.length; i++) {
    let diag = prev[0];
    prev[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const tmp = prev[j];
      prev[j] = Math.min(prev[j] + 1, prev[j - 1] + 1, diag + (a[i - 1] === b[j - 1] ? 0 : 1));
      diag = tmp;
    }
  }
  return prev[b.length];
}
