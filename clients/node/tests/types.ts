/**
 * Named types (mutex, read/write lock, semaphore), the scoped idioms (`runExclusive`,
 * `await using`) and the node-redlock-shaped adapter, on every client library.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type Redis from 'ioredis';

import { LeaseLost, Leases, NotAcquired, Redlock, ResourceLockedError } from '../src';
import { CLIENT_KINDS, type Flavor, leaseInfo, makeClient, Server, serverBinary, sleep, type TestClient, waitFor } from './harness';

let seq = 0;
const unique = (name: string): string => `${name}:${process.pid}:${++seq}`;

async function stateOf(admin: Redis, key: string): Promise<string> {
  return String((await leaseInfo(admin, key))?.state ?? 'free');
}

export function defineTypes(flavor: Flavor): void {
  if (!serverBinary(flavor)) return;
  describe(flavor, () => {
    describe('named types, idioms and the Redlock adapter', { concurrency: 3 }, () => {
      let server: Server;
      let admin: Redis;
      before(async () => {
        server = await Server.start(flavor);
        admin = server.admin();
      });
      after(async () => {
        admin?.disconnect();
        await server?.stop();
      });

      for (const kind of CLIENT_KINDS) {
        /** Two Leases over two clients of `kind` (two processes, as far as the server knows). */
        async function two(fn: (a: Leases, b: Leases) => Promise<void>): Promise<void> {
          const ca: TestClient = await makeClient(kind, server.port);
          const cb: TestClient = await makeClient(kind, server.port);
          const a = new Leases(ca.client, { ttlMs: 5000 });
          const b = new Leases(cb.client, { ttlMs: 5000 });
          try {
            await fn(a, b);
          } finally {
            await Promise.all([a.close(), b.close()]);
            await Promise.all([ca.close(), cb.close()]);
          }
        }

        it(`${kind}: read/write lock: readers together, the writer alone`, async () => {
          await two(async (a, b) => {
            const key = unique('rw');
            const ra = await a.readWriteLock(key).read();
            const rb = await b.readWriteLock(key).read();
            assert.ok(ra.shared && rb.shared);
            await assert.rejects(b.readWriteLock(key).write(), NotAcquired);
            await ra.release();
            await rb.release();
            const w = await b.readWriteLock(key).write();
            assert.equal(w.shared, false);
            await assert.rejects(a.readWriteLock(key).read(), NotAcquired);
            await w.release();
            assert.equal(await a.readWriteLock(key).runWrite(async (lease) => lease.fence > w.fence), true);
            assert.equal(await a.readWriteLock(key).runRead(async (lease) => lease.shared), true);
          });
        });

        it(`${kind}: semaphore: at most permits holders; another permit count is refused`, async () => {
          await two(async (a, b) => {
            const key = unique('sem');
            const p1 = await a.semaphore(key, 2).acquire();
            const p2 = await b.semaphore(key, 2).acquire();
            await assert.rejects(a.semaphore(key, 2).acquire(), NotAcquired);
            await assert.rejects(b.semaphore(key, 3).acquire(), /LIMIT does not match/);
            await p1.release();
            assert.equal(await b.semaphore(key, 2).runExclusive(async (lease) => lease.key), key);
            await p2.release();
            assert.equal(await stateOf(admin, key), 'free');
            assert.throws(() => a.semaphore(key, 0), RangeError);
          });
        });

        it(`${kind}: runExclusive serializes two waiters; await using releases at the block's end`, async () => {
          await two(async (a, b) => {
            const key = unique('mutex');
            let inside = 0;
            let overlap = false;
            const body = async (): Promise<number> => {
              inside++;
              if (inside > 1) overlap = true;
              await sleep(50);
              inside--;
              return 1;
            };
            const results = await Promise.all([
              a.mutex(key, { blockMs: 5000 }).runExclusive(body),
              b.runExclusive(key, body, { blockMs: 5000 }),
            ]);
            assert.deepEqual(results, [1, 1]);
            assert.equal(overlap, false);

            const scoped = unique('scoped');
            {
              await using lease = await a.acquire(scoped);
              assert.equal(lease.state, 'held');
              assert.equal(await stateOf(admin, scoped), 'held');
            }
            assert.equal(await stateOf(admin, scoped), 'free');
          });
        });

        it(`${kind}: Redlock shape: acquire, ResourceLockedError, extend, release, expiry without extend`, async () => {
          const ca = await makeClient(kind, server.port);
          const cb = await makeClient(kind, server.port);
          const ra = new Redlock([ca.client]);
          const rb = new Redlock(cb.client, { retryCount: 2, retryDelay: 10, retryJitter: 10 });
          try {
            const [x, y] = [unique('rl-b'), unique('rl-a')];
            const lock = await ra.acquire([x, y], 3000);
            assert.deepEqual(lock.resources, [y, x].sort());
            assert.equal(lock.fences.length, 2);
            assert.ok(lock.expiration > Date.now());
            const err = await rb.acquire([y], 3000).then(
              () => assert.fail('acquired a held resource'),
              (e: unknown) => e,
            );
            assert.ok(err instanceof ResourceLockedError, String(err));
            assert.equal(err.attempts, 3);
            const longer = await lock.extend(10_000);
            assert.ok(longer.expiration >= lock.expiration);
            const ttl = Number((await leaseInfo(admin, x))?.ttl);
            assert.ok(ttl > 3000, `ttl ${ttl} after extend`);
            await longer.release();
            assert.equal(await stateOf(admin, x), 'free');
            assert.equal(await stateOf(admin, y), 'free');
            // Not extended: it expires (node-redlock's acquire does not renew).
            const short = await rb.acquire([x], 300);
            // The client's deadline counts from when the acquire was sent: never later than the server's.
            await waitFor('expired', async () => (await stateOf(admin, x)) === 'free' && short._leases[0]!.state === 'lost', 3000);
            await assert.rejects(short.extend(1000));
          } finally {
            await Promise.all([ra.quit(), rb.quit()]);
            await Promise.all([ca.close(), cb.close()]);
          }
        });

        it(`${kind}: Redlock using(): renewed past its duration; a loss aborts the signal and rejects`, async () => {
          const c = await makeClient(kind, server.port);
          const redlock = new Redlock([c.client]);
          try {
            const key = unique('rl-using');
            const out = await redlock.using([key], 900, async (signal) => {
              await sleep(2000);
              assert.equal(signal.aborted, false);
              return 'done';
            });
            assert.equal(out, 'done');
            assert.equal(await stateOf(admin, key), 'free');
            let seen: Error | undefined;
            await assert.rejects(
              redlock.using([key], 600, async (signal) => {
                await admin.del(key);
                await waitFor('the signal', () => signal.aborted, 3000);
                seen = signal.error;
              }),
              LeaseLost,
            );
            assert.ok(seen instanceof LeaseLost);
          } finally {
            await redlock.quit();
            await c.close();
          }
        });
      }
    });
  });
}
