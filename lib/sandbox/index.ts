/**
 * The sandboxes for model-written programs (DESIGN §7):
 * - `python`: a warm pool of isolated Python workers (lib/sandbox/python.ts and python-worker.ts, python/sandbox_runner.py and python/slm_sandbox/);
 * - `quickjs`: JavaScript in QuickJS/WebAssembly (lib/sandbox/quickjs.ts).
 * Both return the same SandboxResult and take the same limits.
 */
import { SlmError, closest } from '../errors.js';
import { createPythonPool, type PythonPoolOptions } from './python.js';
import { createQuickJSSandbox, type QuickJSSandboxOptions } from './quickjs.js';
import type { Sandbox, SandboxKind } from './types.js';

export * from './types.js';
export {
  checkRequiredIsolation,
  detectIsolation,
  filesystemLine,
  ISOLATION_ORDER,
  resolvePython,
  type DetectOptions,
} from './isolation.js';
export { createPythonPool, runPythonOnce, PythonSandboxPool, type PythonPoolOptions } from './python.js';
export { createQuickJSSandbox, QuickJSSandbox, type QuickJSSandboxOptions } from './quickjs.js';

export type CreateSandboxOptions = ({ kind: 'python' } & PythonPoolOptions) | ({ kind: 'quickjs' } & QuickJSSandboxOptions);

const KEYS: Record<SandboxKind, string[]> = {
  python: [
    'kind',
    'tools',
    'extraTools',
    'size',
    'maxLevel',
    'requireIsolation',
    'python',
    'workdirMb',
    'uid',
    'allowWeakIsolation',
    'timeoutMs',
    'cpuSeconds',
    'memoryMb',
    'maxOutputChars',
    'maxCalls',
  ],
  quickjs: ['kind', 'tools', 'extraTools', 'stackKb', 'size', 'timeoutMs', 'cpuSeconds', 'memoryMb', 'maxOutputChars', 'maxCalls'],
};

/** `createSandbox({ kind: 'python', tools, timeoutMs: 5000 })`; unknown option names are errors. */
export async function createSandbox(opts: CreateSandboxOptions): Promise<Sandbox> {
  const kind = (opts as { kind?: unknown }).kind;
  if (kind !== 'python' && kind !== 'quickjs') {
    throw new SlmError('ARGUMENT_INVALID', `Expected sandbox kind "python" or "quickjs" but received ${JSON.stringify(kind)}.`);
  }
  for (const k of Object.keys(opts)) {
    if (!KEYS[kind].includes(k)) {
      const hint = closest(k, KEYS[kind]);
      throw new SlmError(
        'CONFIG_UNKNOWN_KEY',
        `Unknown ${kind} sandbox option "${k}"${hint ? `; did you mean "${hint}"?` : ''}. Options: ${KEYS[kind].join(', ')}.`,
      );
    }
  }
  const { kind: _kind, ...rest } = opts;
  return kind === 'python' ? createPythonPool(rest as PythonPoolOptions) : createQuickJSSandbox(rest as QuickJSSandboxOptions);
}
