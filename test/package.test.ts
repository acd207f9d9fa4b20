// The package as a user installs it: `npm pack`, then `npm install <tarball>` into an empty folder,
// then `npx slm-train doctor` and a tiny `generate` there — using the prebuilt binary, with no
// compiler invoked for slm-train (every compiler on PATH is a recorder that fails) and no build folder.
import t from 'tap';
import { recordingCompilers } from './helpers/fake-compilers.js';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fixture, repoRoot } from './helpers/shared.js';

t.test('npm pack -> install -> doctor and generate without compiling', { timeout: 900_000 }, async (t) => {
  const work = t.testdir();
  // 1-2. the tarball: `npm pack` alone (its prepack runs scripts/prebuild.mjs) puts the prebuilt binary
  // of this build, tagged with what it links against, in it (test/pack.test.ts checks the tag).
  t.teardown(() => rmSync(join(repoRoot, 'prebuilds'), { recursive: true, force: true }));
  const out = execFileSync('npm', ['pack', '--pack-destination', work, '--json'], {
    cwd: repoRoot,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const packed = JSON.parse(out)[0];
  const tarball = join(work, packed.filename);
  t.ok(existsSync(tarball));
  const pre = (packed.files as Array<{ path: string }>)
    .map((f) => f.path)
    .filter((p) => p.startsWith(`prebuilds/${process.platform}-${process.arch}/`));
  t.ok(
    pre.some((f) => /\/slm_train\.torch-[\d.]+\.(cpu|cuda)\.napi\d+\.node$/.test(f)),
    `tagged prebuilt in the tarball: ${pre.join(', ')}`,
  );
  // 3. compilers that record their use and fail
  const { bin, log } = recordingCompilers(work);
  const app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }));
  const env = {
    ...process.env,
    PATH: `${bin}:${process.env.PATH}`,
    CC: join(bin, 'cc'),
    CXX: join(bin, 'c++'),
    npm_config_audit: 'false',
    npm_config_fund: 'false',
  };
  const inst = spawnSync('npm', ['install', tarball, '--prefer-offline', '--no-audit', '--no-fund'], {
    cwd: app,
    env,
    encoding: 'utf8',
    timeout: 600_000,
  });
  t.equal(inst.status, 0, `npm install: ${inst.stderr.slice(-500)}`);
  const pkg = join(app, 'node_modules', 'slm-train');
  t.ok(existsSync(join(pkg, 'dist', 'lib', 'cli', 'main.js')), 'compiled CLI shipped in the tarball');
  t.notOk(existsSync(join(pkg, 'build')), 'no build folder: nothing was compiled for slm-train');
  const compiled = existsSync(log)
    ? readFileSync(log, 'utf8')
        .split('\n')
        .filter((l) => l.includes('slm-train'))
    : [];
  t.same(compiled, [], 'no compiler was invoked for slm-train');
  // 4. the CLI from the installed package
  const doctor = spawnSync('npx', ['slm-train', 'doctor', '--json'], { cwd: app, env, encoding: 'utf8', timeout: 120_000 });
  t.equal(doctor.status, 0, doctor.stderr);
  const d = JSON.parse(doctor.stdout);
  t.equal(d.binding.kind, 'prebuilt');
  t.match(d.binding.path, /node_modules\/slm-train\/prebuilds\//);
  const gen = spawnSync(
    'npx',
    [
      'slm-train',
      'generate',
      '--model',
      fixture('qwen3', 'tiny-qwen3-f32'),
      '--ids',
      '204,125,373,399,458',
      '--max-new-tokens',
      '8',
      '--greedy',
      '--json',
    ],
    { cwd: app, env, encoding: 'utf8', timeout: 120_000 },
  );
  t.equal(gen.status, 0, gen.stderr);
  t.same(JSON.parse(gen.stdout).ids, [184, 184, 184, 184, 184, 184, 184, 184], 'the golden greedy decode');
  // 5. the library: the README's example, compiled (strict) against the installed package's types
  // and run with node; importing the package alone has no side effects.
  const pj = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8'));
  t.same(pj.exports['.'], { types: './dist/lib/index.d.ts', import: './dist/lib/index.js' }, 'exports map');
  t.ok(
    existsSync(join(pkg, 'dist', 'lib', 'index.js')) && existsSync(join(pkg, 'dist', 'lib', 'index.d.ts')),
    'the entry point and its types are shipped',
  );
  const bare = spawnSync(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      `const before = JSON.stringify(process.env); const m = await import('slm-train'); const maps = (await import('node:fs')).readFileSync('/proc/self/maps', 'utf8'); console.log(JSON.stringify({ n: Object.keys(m).length, env: before === JSON.stringify(process.env), native: /libtorch|slm_train[^/]*\\.node/.test(maps), model: typeof m.Model, train: typeof m.trainFromConfig }));`,
    ],
    { cwd: app, env, encoding: 'utf8', timeout: 60_000 },
  );
  t.equal(bare.status, 0, bare.stderr);
  const imp = JSON.parse(bare.stdout.trim().split('\n').pop()!);
  t.same(
    { env: imp.env, native: imp.native, model: imp.model, train: imp.train },
    { env: true, native: false, model: 'function', train: 'function' },
    'import: no env change, native engine not loaded',
  );
  t.equal(bare.stdout.trim().split('\n').length, 1, 'import prints nothing');
  const readme = readFileSync(join(repoRoot, 'README.md'), 'utf8');
  const block = /<!-- library-example:start -->\s*```ts\n([\s\S]*?)```\s*<!-- library-example:end -->/.exec(readme);
  t.ok(block, 'the README has the library example');
  writeFileSync(join(app, 'example.mts'), block![1]);
  writeFileSync(
    join(app, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'ES2022',
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        strict: true,
        outDir: 'out',
        typeRoots: [join(repoRoot, 'node_modules', '@types')],
        types: ['node'],
      },
      files: ['example.mts'],
    }),
  );
  const tsc = spawnSync(process.execPath, [join(repoRoot, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', app], {
    cwd: app,
    env,
    encoding: 'utf8',
    timeout: 120_000,
  });
  t.equal(tsc.status, 0, `tsc: ${tsc.stdout}${tsc.stderr}`);
  const ex = spawnSync(process.execPath, [join(app, 'out', 'example.mjs')], { cwd: app, env, encoding: 'utf8', timeout: 300_000 });
  t.equal(ex.status, 0, ex.stderr);
  const r = JSON.parse(ex.stdout.trim().split('\n').pop()!);
  t.equal(r.generated, 4, 'generate gave the 4 tokens asked for');
  t.equal(r.turns.length, 2, 'one episode per question');
  t.ok(
    r.scores.every((x: number) => Number.isFinite(x)),
    'the custom reward scored them',
  );
  t.equal(r.steps, 1, 'one GRPO step trained');
  t.equal(r.questions, 2, 'the adapter evaluated on both questions');
  // The random model answers neither question, so EM alone would give 0; the custom reward's
  // -0.1 per turn makes the evaluation's mean reward negative.
  t.ok(r.evalReward < 0, `the evaluation's reward is the custom function's (${r.evalReward})`);
});
