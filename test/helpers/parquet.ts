import { execFileSync } from 'node:child_process';
import { repoRoot } from './shared.js';

/**
 * Writes `rows` (objects with the same keys) as a Parquet file with hyparquet-writer, one column per
 * key; `types` pins a column's Parquet type where inference would not (e.g. STRING). The writer runs
 * in a plain node process: tap's TypeScript loader cannot resolve its wildcard subpath import of hyparquet.
 */
export function writeParquet(file: string, rows: ReadonlyArray<Record<string, unknown>>, types: Record<string, string> = {}): void {
  const columnData = Object.keys(rows[0]).map((name) => ({
    name,
    data: rows.map((r) => r[name]),
    ...(types[name] ? { type: types[name] } : {}),
  }));
  execFileSync(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      `import { parquetWriteFile } from 'hyparquet-writer'; await parquetWriteFile(${JSON.stringify({ filename: file, columnData })});`,
    ],
    { cwd: repoRoot },
  );
}
