#!/usr/bin/env node
// Packs the built addon as a prebuilt binary (prebuildify-style layout):
//   prebuilds/<platform>-<arch>/slm_train.<tag>.node   + slm_train.<tag>.json
// where <tag> says what the binary links against: torch-<version>.<cpu|cuda>.napi<N>.
// The loader (lib/binding) prefers a prebuilt binary whose tag matches this machine and falls back to
// a local build; `npm install` skips compiling when one is present (scripts/install-native.mjs).
import { copyFileSync, existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const built = join(root, 'build', 'Release', 'slm_train.node');
if (!existsSync(built)) {
  console.error(`prebuild: ${built} does not exist; run \`npm run build:native\` first.`);
  process.exit(1);
}
const addon = createRequire(import.meta.url)(built);
const v = addon.version();
const tag = `torch-${v.torch}.${v.cuda ? 'cuda' : 'cpu'}.napi${v.napi}`;
const dir = join(root, 'prebuilds', `${process.platform}-${process.arch}`);
mkdirSync(dir, { recursive: true });
for (const f of readdirSync(dir)) if (f.startsWith('slm_train.')) rmSync(join(dir, f));
copyFileSync(built, join(dir, `slm_train.${tag}.node`));
writeFileSync(
  join(dir, `slm_train.${tag}.json`),
  JSON.stringify({ torch: v.torch, device: v.cuda ? 'cuda' : 'cpu', napi: v.napi, platform: process.platform, arch: process.arch, built: new Date().toISOString() }, null, 2) + '\n',
);
console.log(`prebuild: ${join(dir, `slm_train.${tag}.node`)}`);
