// Compilers that record their use and fail: a folder of scripts named cc, gcc, g++, c++, clang,
// clang++, cmake, make and ninja, each appending "NAME CWD" to `log` and exiting 1. Put `bin` first
// on PATH (and CC / CXX) to show that an install step builds nothing.
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export function recordingCompilers(work: string): { bin: string; log: string } {
  const bin = join(work, 'fake-bin');
  mkdirSync(bin);
  const log = join(work, 'compiler.log');
  for (const c of ['cc', 'gcc', 'g++', 'c++', 'clang', 'clang++', 'cmake', 'make', 'ninja']) {
    writeFileSync(join(bin, c), `#!/bin/sh\necho "${c} $PWD" >> ${log}\nexit 1\n`);
    chmodSync(join(bin, c), 0o755);
  }
  return { bin, log };
}
