/** Every command of the CLI, one module each (DESIGN §4). */
import type { CommandModule } from 'yargs';
import { benchCommand } from './bench.js';
import { demoCommand } from './demo.js';
import { doctorCommand } from './doctor.js';
import { generateCommand } from './generate.js';
import { initModelCommand } from './init-model.js';
import { logitsCommand } from './logits.js';
import { reportCommand } from './report.js';
import { execCommand, indexCommand, searchCommand, serveRetrieverCommand } from './retrieval.js';
import { serveCommand } from './serve.js';
import { evalCommand, trainCommand } from './train.js';
import { exportCommand } from './export.js';
import { pushCommand } from './push.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
// biome-ignore lint/suspicious/noExplicitAny: each command's arguments are its own type; yargs takes the list as it is.
export const commands: CommandModule<any, any>[] = [
  demoCommand,
  trainCommand,
  evalCommand,
  reportCommand,
  indexCommand,
  searchCommand,
  execCommand,
  logitsCommand,
  generateCommand,
  serveCommand,
  serveRetrieverCommand,
  initModelCommand,
  doctorCommand,
  benchCommand,
  exportCommand,
  pushCommand,
];
