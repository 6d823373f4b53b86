/**
 * Run as a child process by the seed-scenario test, since it stops this process's whole
 * event loop: worker A is paused past its lease while B takes the key and writes.
 * Prints one JSON line: what A saw.
 */
import assert from 'node:assert/strict';

import { LeaseLost, Leases } from '../src';
import { type ClientKind, leaseInfo, makeClient, waitFor } from './harness';

/** A stop-the-world pause (a long GC, a stopped VM): nothing in this process runs. */
function pauseProcess(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

async function main(): Promise<void> {
  const [kind, port, key, res, data] = process.argv.slice(2) as [ClientKind, string, string, string, string];
  const ca = await makeClient(kind, Number(port));
  const cb = await makeClient(kind, Number(port));
  const admin = await makeClient('ioredis', Number(port));
  const a = new Leases(ca.client);
  const b = new Leases(cb.client);
  const ttl = 400;
  let bWrote: Promise<void> = Promise.resolve();
  let stateAfterPause = '';
  let secondWrite = '';
  const outcome = await a
    .using(key, { ttlMs: ttl }, async (lease) => {
      await lease.fenceCall(res, 'SET', data, 'a: part 1');
      // B waits for the key; the server hands it over when A's lease expires.
      // B's ttl outlasts the pause, which stops B's process as well.
      bWrote = b.using(key, { ttlMs: 5000, blockMs: 10_000 }, async (bl) => {
        await bl.fenceCall(res, 'SET', data, 'b: all');
      });
      await waitFor('B to wait', async () => (await leaseInfo(admin.client as never, key))?.waiters === 1);
      pauseProcess(3 * ttl);
      // A wakes and goes on: its lease reads as lost at once, before any write.
      stateAfterPause = lease.state;
      try {
        await lease.fenceCall(res, 'SET', data, 'a: part 2');
        secondWrite = 'written';
      } catch (err) {
        secondWrite = (err as Error).name;
      }
    })
    .then(
      () => 'completed',
      (err: unknown) => (err instanceof LeaseLost ? 'LeaseLost' : String(err)),
    );
  await bWrote;
  assert.ok(true);
  await a.close();
  await b.close();
  await Promise.all([ca.close(), cb.close(), admin.close()]);
  console.log(JSON.stringify({ outcome, stateAfterPause, secondWrite }));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
