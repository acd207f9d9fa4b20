/** `slm-train doctor` */
import type { CommandModule } from 'yargs';
import { doctor, formatDoctor } from '../doctor.js';
import { print } from './common.js';

export const doctorCommand: CommandModule<object, { json?: boolean }> = {
  command: 'doctor',
  describe: 'report libtorch, BLAS speed, threads, CUDA, python3 and sandbox isolation',
  builder: (y) => y.option('json', { type: 'boolean' }) as never,
  handler: async (a) => {
    const r = await doctor();
    print(a.json ? JSON.stringify(r, null, 2) : formatDoctor(r));
  },
};
