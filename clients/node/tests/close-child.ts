/**
 * Run as a child process by the close() test: holds leases, closes, and reports whether
 * any timer created since it started is still alive. It must then exit by itself.
 */
import { createHook } from 'node:async_hooks';

import { Leases } from '../src';
import { performance } from 'node:perf_hooks';

import { type ClientKind, makeClient, waitFor } from './harness';

const live = new Set<number>();
createHook({
  init(id, type) {
    if (type === 'Timeout') live.add(id);
  },
  destroy(id) {
    live.delete(id);
  },
}).enable();

async function main(): Promise<void> {
  const [kind, port] = process.argv.slice(2) as [ClientKind, string];
  const c = await makeClient(kind, Number(port));
  const leases = new Leases(c.client);
  const keys = [0, 1, 2].map((i) => `close:${kind}:${process.pid}:${i}`);
  const held = await Promise.all(keys.map((k) => leases.acquire(k, { ttlMs: 300 })));
  await waitFor('a renewal', () => held.every((l) => l._renewals >= 1));
  const timersDuring = live.size;
  await leases.close();
  if (!held.every((l) => l.state === 'released')) throw new Error('close() left a lease unreleased');
  await c.close();
  // Polled with setImmediate, which makes no Timeout of its own.
  const start = performance.now();
  while (live.size > 0) {
    if (performance.now() - start > 2000) throw new Error(`${live.size} timer(s) left after close()`);
    await new Promise((r) => setImmediate(r));
  }
  console.log(JSON.stringify({ keys, timersDuring }));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
