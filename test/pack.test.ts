// `npm pack` ships the prebuilt native addon (issue 36, item 1): packing runs scripts/prebuild.mjs
// (package.json "prepack"), so the tarball holds prebuilds/<platform>-<arch>/slm_train.<tag>.node and
// its .json, with the tag of the addon in build/Release; unpacked, its install step
// (scripts/install-native.mjs) uses that binary and compiles nothing, and the loader picks it.
// Without a built addon, `npm pack` refuses with the commands that fix it.
// The pack runs in a copy of the working tree (tracked and untracked, not ignored files, plus the built
// addon), so the checkout's own dist/ and prebuilds/ are not touched. test/package.test.ts goes on to
// `npm install` the tarball and train with it.
import t from 'tap';
import { recordingCompilers } from './helpers/fake-compilers.js';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { repoRoot } from './helpers/shared.js';

const built = join(repoRoot, 'build', 'Release', 'slm_train.node');
const sha = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');

t.test(
  'npm pack puts the prebuilt addon in the tarball; installing it compiles nothing',
  { timeout: 300_000, skip: existsSync(built) ? false : `${built} is not built (npm run build:native)` },
  async (t) => {
    const work = t.testdir();
    const pkg = join(work, 'pkg');
    const files = execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: repoRoot, encoding: 'utf8' })
      .split('\0')
      .filter((f) => f !== '' && existsSync(join(repoRoot, f)));
    for (const f of files) {
      mkdirSync(dirname(join(pkg, f)), { recursive: true });
      copyFileSync(join(repoRoot, f), join(pkg, f));
    }
    mkdirSync(join(pkg, 'build', 'Release'), { recursive: true });
    copyFileSync(built, join(pkg, 'build', 'Release', 'slm_train.node'));
    symlinkSync(join(repoRoot, 'node_modules'), join(pkg, 'node_modules'));

    // What the built addon says it links against: the tag the prebuilt binary must carry.
    const v = JSON.parse(
      execFileSync(process.execPath, ['-e', `console.log(JSON.stringify(require(${JSON.stringify(built)}).version()))`], {
        encoding: 'utf8',
      })
        .trim()
        .split('\n')
        .pop()!,
    );
    const tag = `torch-${v.torch}.${v.cuda ? 'cuda' : 'cpu'}.napi${v.napi}`;
    const dir = `prebuilds/${process.platform}-${process.arch}`;

    // 1. npm pack, nothing run by hand before it; --json's stdout stays parseable.
    const out = join(work, 'out');
    mkdirSync(out);
    const pack = spawnSync('npm', ['pack', '--json', '--pack-destination', out], { cwd: pkg, encoding: 'utf8', timeout: 240_000 });
    t.equal(pack.status, 0, `npm pack: ${pack.stderr.slice(-1000)}`);
    const info = JSON.parse(pack.stdout)[0];
    const listed = (info.files as Array<{ path: string }>).map((f) => f.path);
    const shipped = listed.filter((p) => p.startsWith('prebuilds/'));
    t.same(
      shipped.sort(),
      [`${dir}/slm_train.${tag}.json`, `${dir}/slm_train.${tag}.node`],
      `the tarball's prebuilds/ is this build's binary, tagged ${tag}`,
    );
    t.ok(
      listed.includes('dist/lib/index.js') && listed.includes('scripts/install-native.mjs'),
      'the compiled library and the install step are shipped',
    );
    t.notOk(
      listed.some((p) => p.startsWith('build/')),
      'no build folder in the tarball',
    );
    t.match(pack.stderr, `prebuild: `, 'prepack ran scripts/prebuild.mjs');

    // 2. Unpacked: the binary is the built one, its .json says what it links against.
    const x = join(work, 'x');
    mkdirSync(x);
    execFileSync('tar', ['-xzf', join(out, info.filename), '-C', x]);
    const unpacked = join(x, 'package');
    t.equal(sha(join(unpacked, dir, `slm_train.${tag}.node`)), sha(built), 'the prebuilt binary is build/Release/slm_train.node');
    const meta = JSON.parse(readFileSync(join(unpacked, dir, `slm_train.${tag}.json`), 'utf8'));
    t.same(
      { torch: meta.torch, device: meta.device, napi: meta.napi, platform: meta.platform, arch: meta.arch },
      { torch: v.torch, device: v.cuda ? 'cuda' : 'cpu', napi: v.napi, platform: process.platform, arch: process.arch },
    );

    // 3. Its install step with every compiler a recorder that fails, and no cmake-js (no node_modules):
    //    it reports the prebuilt binary and builds nothing.
    const { bin, log } = recordingCompilers(work);
    const env: NodeJS.ProcessEnv = { ...process.env, PATH: `${bin}:${process.env.PATH}`, CC: join(bin, 'cc'), CXX: join(bin, 'c++') };
    delete env.SLM_TRAIN_SKIP_NATIVE;
    delete env.SLM_TRAIN_NATIVE;
    const inst = spawnSync(process.execPath, [join(unpacked, 'scripts', 'install-native.mjs')], {
      cwd: unpacked,
      env,
      encoding: 'utf8',
      timeout: 60_000,
    });
    t.equal(inst.status, 0, `install-native: ${inst.stdout}${inst.stderr}`);
    t.match(inst.stdout, `slm-train: using the prebuilt native addon in ${join(unpacked, dir)}; nothing to compile.`);
    t.notOk(existsSync(log), 'no compiler was invoked');
    t.notOk(existsSync(join(unpacked, 'build')), 'no build folder');

    // 4. The loader of the unpacked package takes the prebuilt binary.
    const load = spawnSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const b = await import(${JSON.stringify(join(unpacked, 'dist', 'lib', 'binding', 'index.js'))}); const l = b.loadBinding(); console.log(JSON.stringify({ kind: l.kind, path: l.path, torch: l.addon.version().torch }));`,
      ],
      { cwd: unpacked, env, encoding: 'utf8', timeout: 60_000 },
    );
    t.equal(load.status, 0, load.stderr);
    t.same(JSON.parse(load.stdout.trim().split('\n').pop()!), {
      kind: 'prebuilt',
      path: join(unpacked, dir, `slm_train.${tag}.node`),
      torch: v.torch,
    });

    // 5. What it needs at run time: its NEEDED libraries, and (on Debian) the packages that hold them —
    //    libtorch1.13 (not -dev) and the C/C++ runtime, which the README names.
    const readelf = spawnSync('readelf', ['-d', join(unpacked, dir, `slm_train.${tag}.node`)], { encoding: 'utf8' });
    if (readelf.status === 0) {
      const needed = [...readelf.stdout.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]!);
      t.ok(needed.includes(`libtorch_cpu.so.${v.torch.split('.').slice(0, 2).join('.')}`), `links libtorch: ${needed.join(' ')}`);
      const ldd = spawnSync('ldd', [join(unpacked, dir, `slm_train.${tag}.node`)], { encoding: 'utf8' });
      const paths = new Map([...ldd.stdout.matchAll(/^\s*(\S+) => (\/\S+)/gm)].map((m) => [m[1]!, m[2]!]));
      // dpkg knows a library by the path its package installed (/usr/lib/... or /lib/...; merged /usr).
      const owner = (p: string) => {
        for (const q of [p, p.startsWith('/usr/') ? p.slice(4) : `/usr${p}`]) {
          const r = spawnSync('dpkg', ['-S', q], { encoding: 'utf8' });
          if (r.status === 0) return r.stdout.trim().split('\n')[0]!.split(':')[0]!;
        }
        return null;
      };
      const dpkgHere = spawnSync('dpkg', ['--version'], { encoding: 'utf8' }).status === 0;
      if (dpkgHere) {
        const owners = [...new Set(needed.filter((n) => paths.has(n)).map((n) => owner(paths.get(n)!) ?? `(no package: ${n})`))].sort();
        t.ok(
          owners.every((o) => /^(libtorch[\d.]+|libgomp1|libstdc\+\+6|libgcc-s1|libc6)$/.test(o)),
          `Debian packages of its NEEDED libraries: ${owners.join(', ')}`,
        );
        t.notOk(
          owners.some((o) => o.endsWith('-dev')),
          'no -dev package at run time',
        );
      } else t.comment('dpkg not installed: the Debian package check is skipped');
    } else t.comment('readelf not installed: the NEEDED check is skipped');

    // 6. Without a built addon, npm pack refuses (before compiling the TypeScript) and says what to do.
    rmSync(join(pkg, 'build'), { recursive: true });
    const refused = spawnSync('npm', ['pack', '--dry-run', '--json'], { cwd: pkg, encoding: 'utf8', timeout: 120_000 });
    t.not(refused.status, 0, 'npm pack fails without build/Release/slm_train.node');
    t.match(refused.stderr, 'prebuild: the native addon is not built');
    t.match(refused.stderr, 'npm run build:native && npm pack');
  },
);
