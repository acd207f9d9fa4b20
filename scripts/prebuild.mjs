#!/usr/bin/env node
// Packs the built addon as a prebuilt binary (prebuildify-style layout):
//   prebuilds/<platform>-<arch>/slm_train.<tag>.node   + slm_train.<tag>.json
// where <tag> says what the binary links against: torch-<version>.<cpu|cuda>.napi<N>.
// The loader (lib/binding) prefers a prebuilt binary whose tag matches this machine and falls back to
// a local build; `npm install` skips compiling when one is present (scripts/install-native.mjs).
// `npm pack` runs this (package.json "prepack"), so every tarball carries the binary of the build in
// build/Release; it refuses to pack without one. `npm run prebuilds` runs it alone.
import { copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const built = join(root, 'build', 'Release', 'slm_train.node');
if (!existsSync(built)) {
  console.error(
    [
      `prebuild: the native addon is not built (${built} does not exist), so there is no prebuilt binary to pack.`,
      'A tarball without one would compile libtorch code on every install. Build it first, then pack:',
      '  sudo apt-get install -y cmake g++ libtorch-dev nlohmann-json3-dev libopenblas0-openmp',
      '  npm run build:native && npm pack',
    ].join('\n'),
  );
  process.exit(1);
}
let addon;
try {
  addon = createRequire(import.meta.url)(built);
} catch (e) {
  console.error(
    `prebuild: ${built} exists but does not load (${String(e.message).split('\n')[0]}); rebuild it with \`npm run build:native\` (a "cannot open shared object file" means libtorch is not installed: apt-get install libtorch1.13).`,
  );
  process.exit(1);
}
const v = addon.version();
const tag = `torch-${v.torch}.${v.cuda ? 'cuda' : 'cpu'}.napi${v.napi}`;
const dir = join(root, 'prebuilds', `${process.platform}-${process.arch}`);
mkdirSync(dir, { recursive: true });
for (const f of readdirSync(dir)) if (f.startsWith('slm_train.')) rmSync(join(dir, f));
copyFileSync(built, join(dir, `slm_train.${tag}.node`));
writeFileSync(
  join(dir, `slm_train.${tag}.json`),
  JSON.stringify(
    {
      torch: v.torch,
      device: v.cuda ? 'cuda' : 'cpu',
      napi: v.napi,
      platform: process.platform,
      arch: process.arch,
      built: new Date().toISOString(),
    },
    null,
    2,
  ) + '\n',
);
console.error(`prebuild: ${join(dir, `slm_train.${tag}.node`)}`);
