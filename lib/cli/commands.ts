/** Every command of the CLI, one module each (DESIGN §4). */
import type { CommandModule } from 'yargs';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export const commands: CommandModule<any, any>[] = [];
