#!/usr/bin/env node
// npm's `install` step for slm-train's native addon:
//   1. a prebuilt binary in prebuilds/<platform>-<arch>/ that matches this machine -> nothing to build;
//   2. otherwise build from source with cmake-js (CMakeLists.txt; needs cmake, a C++17 compiler,
//      libtorch-dev and nlohmann-json3-dev — the README lists the Debian packages).
// `--force` rebuilds even when a binary is present. SLM_TRAIN_SKIP_NATIVE=1 skips the step (for
// installs that only use the sandbox or retrieval parts).
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { cpus } from 'node:os';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const force = process.argv.includes('--force');

if (process.env.SLM_TRAIN_SKIP_NATIVE === '1' && !force) {
  console.log('slm-train: SLM_TRAIN_SKIP_NATIVE=1, not building the native addon.');
  process.exit(0);
}

const prebuildDir = join(root, 'prebuilds', `${process.platform}-${process.arch}`);
if (!force && existsSync(prebuildDir) && readdirSync(prebuildDir).some((f) => f.endsWith('.node'))) {
  console.log(`slm-train: using the prebuilt native addon in ${prebuildDir}; nothing to compile.`);
  process.exit(0);
}

const cmakeJs = join(root, 'node_modules', 'cmake-js', 'bin', 'cmake-js');
const cmakeJsPath = existsSync(cmakeJs) ? cmakeJs : join(root, '..', 'cmake-js', 'bin', 'cmake-js');
const jobs = String(Math.max(1, cpus().length));
const args = [cmakeJsPath, 'compile', '--parallel', jobs, '--out', join(root, 'build')];
if (process.env.SLM_TRAIN_TORCH_DIR) args.push(`--CDCMAKE_PREFIX_PATH=${process.env.SLM_TRAIN_TORCH_DIR}`);
console.log(`slm-train: building the native addon (cmake-js, ${jobs} jobs)...`);
const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
if (r.status !== 0) {
  console.error(
    [
      '',
      'slm-train: the native addon failed to build.',
      'It needs cmake, a C++17 compiler, libtorch and nlohmann-json. On Debian/Ubuntu:',
      '  sudo apt-get install -y cmake g++ libtorch-dev nlohmann-json3-dev libopenblas0-openmp',
      'For a CUDA build point SLM_TRAIN_TORCH_DIR at an unpacked CUDA libtorch, then run `npm run build:native`.',
    ].join('\n'),
  );
  process.exit(r.status ?? 1);
}
