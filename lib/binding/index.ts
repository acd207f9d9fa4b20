/**
 * Finds and loads the native addon, like sharp does: a prebuilt binary for this platform first, then
 * a local build; every failure is collected, and when nothing loads one error lists what was tried
 * and the commands that fix it.
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SlmError } from '../errors.js';
import type { NativeAddon } from './types.js';

export type {
  NativeAddon,
  NativeModel,
  NativeAdapterSet,
  NativeValueHead,
  NativeOptimizer,
  NativeModelConfig,
  NativeGenerateRequest,
  NativeGenerateResult,
  NativeVersion,
} from './types.js';

const require = createRequire(import.meta.url);

/** The package root (works from lib/ under ts and from dist/lib/ when compiled). */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'CMakeLists.txt'))) return dir;
    dir = dirname(dir);
  }
  return resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
}

export interface LoadedBinding {
  addon: NativeAddon;
  path: string;
  kind: 'prebuilt' | 'local-build' | 'env';
}

/**
 * Candidate binaries in order of preference: $SLM_TRAIN_NATIVE, then the prebuilt binaries for this
 * platform (`prebuilds/<platform>-<arch>/slm_train.torch-<v>.<cpu|cuda>.napi<n>.node`; CUDA builds
 * first when an NVIDIA device is visible, else CPU builds first), then the local build.
 */
export function candidates(root = packageRoot()): Array<{ path: string; kind: LoadedBinding['kind'] }> {
  const out: Array<{ path: string; kind: LoadedBinding['kind'] }> = [];
  if (process.env.SLM_TRAIN_NATIVE) out.push({ path: resolve(process.env.SLM_TRAIN_NATIVE), kind: 'env' });
  const pre = join(root, 'prebuilds', `${process.platform}-${process.arch}`);
  if (existsSync(pre)) {
    const gpu = existsSync('/dev/nvidia0') || existsSync('/dev/nvidiactl');
    const rank = (f: string) => (/\.cuda\./.test(f) === gpu ? 0 : 1);
    const files = readdirSync(pre)
      .filter((f) => f.endsWith('.node'))
      .sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    for (const f of files) out.push({ path: join(pre, f), kind: 'prebuilt' });
  } else {
    out.push({ path: join(pre, 'slm_train.<tag>.node'), kind: 'prebuilt' });
  }
  const local = join(root, 'build', 'Release', 'slm_train.node');
  // A developer's local build that is newer than the prebuilt binaries wins (it has their changes).
  const newest = Math.max(0, ...out.filter((c) => c.kind === 'prebuilt' && existsSync(c.path)).map((c) => statSync(c.path).mtimeMs));
  const localEntry = { path: local, kind: 'local-build' as const };
  if (existsSync(local) && newest > 0 && statSync(local).mtimeMs > newest)
    out.splice(
      out.findIndex((c) => c.kind === 'prebuilt'),
      0,
      localEntry,
    );
  else out.push(localEntry);
  return out;
}

let loaded: LoadedBinding | undefined;

export function loadBinding(): LoadedBinding {
  if (!loaded) loaded = loadFrom(candidates());
  return loaded;
}

/** Loads the first candidate that works; otherwise one error listing every attempt and the fix. */
export function loadFrom(cands: Array<{ path: string; kind: LoadedBinding['kind'] }>): LoadedBinding {
  const tried: string[] = [];
  for (const c of cands) {
    if (!existsSync(c.path)) {
      tried.push(`${c.path}: not found`);
      continue;
    }
    try {
      const addon = require(c.path) as NativeAddon;
      addon.setErrorClass(NativeSlmError);
      return { addon, path: c.path, kind: c.kind };
    } catch (e) {
      tried.push(`${c.path}: ${(e as Error).message.split('\n')[0]}`);
    }
  }
  throw new SlmError(
    'NATIVE_BINARY_MISSING',
    [
      'the native engine (slm_train.node) could not be loaded. Tried:',
      ...tried.map((t) => `  - ${t}`),
      'A "cannot open shared object file" above means libtorch is not installed or not on the loader path.',
      "A prebuilt binary (prebuilds/) needs only the runtime it was built against, Debian 12's libtorch 1.13 (no compiler):",
      '  sudo apt-get install -y libtorch1.13 libopenblas0-openmp',
      'Otherwise (another libtorch, or no prebuilt binary for this machine) install the system packages and build the addon:',
      '  sudo apt-get install -y cmake g++ libtorch-dev nlohmann-json3-dev libopenblas0-openmp',
      `  cd ${packageRoot()} && npm run build:native`,
    ].join('\n'),
  );
}

export function addon(): NativeAddon {
  return loadBinding().addon;
}

/** The class C++ throws: an SlmError whose constructor takes (code, message). */
class NativeSlmError extends SlmError {
  constructor(code: string, message: string) {
    super(code, message);
  }
}
