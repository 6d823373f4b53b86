/**
 * Confirmed grants: WAIT (or WAITAOF) in the same round trip as the ACQUIRE and every
 * renewal. A master with one replica, both with the module; the replica is stopped to
 * make confirmations fail.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import type Redis from 'ioredis';

import { LeaseLost, Leases, NotConfirmed } from '../src';
import { CLIENT_KINDS, type Flavor, leaseInfo, makeClient, Server, serverBinary, waitFor } from './harness';

let seq = 0;
const unique = (name: string): string => `${name}:${process.pid}:${++seq}`;

async function inSync(replica: Server): Promise<void> {
  const a = replica.admin();
  try {
    await waitFor('the replica in sync', async () => /master_link_status:up/.test(String(await a.info('replication'))), 20_000);
  } finally {
    a.disconnect();
  }
}

async function hasCommand(admin: Redis, name: string): Promise<boolean> {
  const info = (await admin.call('COMMAND', 'INFO', name)) as unknown[];
  return Array.isArray(info) && info[0] !== null && info[0] !== undefined;
}

export function defineConfirm(flavor: Flavor): void {
  if (!serverBinary(flavor)) return;
  describe(flavor, () => {
    describe('confirmed grants (a master and a replica)', { concurrency: 1 }, () => {
      let master: Server;
      let replica: Server;
      let admin: Redis;
      before(async () => {
        master = await Server.start(flavor);
        replica = await Server.start(flavor, { args: ['--replicaof', '127.0.0.1', String(master.port)] });
        admin = master.admin();
        await inSync(replica);
      });
      after(async () => {
        admin?.disconnect();
        await Promise.all([replica?.stop(), master?.stop()]);
      });

      for (const kind of CLIENT_KINDS) {
        it(`${kind}: grant and renewals confirmed by the replica; an unconfirmed renewal is a loss`, async () => {
          const c = await makeClient(kind, master.port);
          const leases = new Leases(c.client, { confirm: { replicas: 1, timeoutMs: 500 } });
          try {
            const key = unique('confirm');
            const lease = await leases.acquire(key, { ttlMs: 1200 });
            assert.equal(lease.replicas, 1);
            await waitFor('two confirmed renewals', () => lease._renewals >= 2, 5000);
            assert.equal(lease.replicas, 1);
            assert.equal(lease.state, 'held');
            process.kill(replica.pid, 'SIGSTOP');
            try {
              await waitFor('lost', () => lease.state === 'lost', 5000);
            } finally {
              process.kill(replica.pid, 'SIGCONT');
            }
            const reason = lease.signal.reason as LeaseLost;
            assert.ok(reason instanceof LeaseLost);
            assert.match(reason.why, /confirmed by 0 of 1 replicas/);
            assert.equal(lease.replicas, 0);
            await inSync(replica);
          } finally {
            await leases.close();
            await c.close();
          }
        });

        it(`${kind}: a grant confirmed by too few replicas is released and rejected (NotConfirmed); per-acquire options win`, async () => {
          const c = await makeClient(kind, master.port);
          const leases = new Leases(c.client, { confirm: { replicas: 1, timeoutMs: 500 } });
          try {
            const key = unique('few');
            const err = await leases.acquire(key, { ttlMs: 5000, confirm: { replicas: 2, timeoutMs: 100 } }).then(
              () => assert.fail('granted without two replicas'),
              (e: unknown) => e,
            );
            assert.ok(err instanceof NotConfirmed, String(err));
            assert.equal(err.wanted, 2);
            assert.equal(err.replicas, 1);
            assert.equal((await leaseInfo(admin, key))?.state ?? 'free', 'free');
            // confirm: null turns the Leases' default off for one acquire.
            const plain = await leases.acquire(key, { ttlMs: 5000, confirm: null });
            assert.equal(plain.replicas, undefined);
            assert.equal(await plain.release(), true);
          } finally {
            await leases.close();
            await c.close();
          }
        });

        it(`${kind}: a blocking acquire is confirmed in the same round trip as its grant`, async () => {
          const c = await makeClient(kind, master.port);
          const leases = new Leases(c.client);
          try {
            const key = unique('blocked');
            const first = await leases.acquire(key, { ttlMs: 5000 });
            const waiting = leases.acquire(key, { ttlMs: 5000, blockMs: 5000, confirm: { replicas: 1, timeoutMs: 500 } });
            await waitFor('a waiter', async () => Number((await leaseInfo(admin, key))?.waiters ?? 0) === 1);
            assert.equal(await first.release(), true);
            const second = await waiting;
            assert.equal(second.replicas, 1);
            assert.ok(second.fence > first.fence);
          } finally {
            await leases.close();
            await c.close();
          }
        });
      }

      it('WAITAOF (confirm.aof) where the server has it; Redis 7.0 rejects it and the grant is given back', async () => {
        const c = await makeClient('ioredis', master.port);
        const leases = new Leases(c.client);
        try {
          const key = unique('aof');
          if (!(await hasCommand(admin, 'WAITAOF'))) {
            await assert.rejects(leases.acquire(key, { ttlMs: 5000, confirm: { replicas: 1, aof: true } }), /unknown command|WAITAOF/i);
            assert.equal((await leaseInfo(admin, key))?.state ?? 'free', 'free');
            return;
          }
          for (const s of [master, replica]) {
            const a = s.admin();
            try {
              // fsync on every write: a replica with `everysec` reports its fsync up to ~2 s late.
              await a.call('CONFIG', 'SET', 'appendonly', 'yes', 'appendfsync', 'always');
              await waitFor('AOF on', async () => {
                const p = String(await a.info('persistence'));
                return /aof_enabled:1/.test(p) && /aof_rewrite_in_progress:0/.test(p) && !/aof_rewrite_scheduled:1/.test(p);
              }, 20_000);
            } finally {
              a.disconnect();
            }
          }
          const lease = await leases.acquire(key, { ttlMs: 3000, confirm: { replicas: 1, aof: true, timeoutMs: 1000 } });
          assert.equal(lease.aofLocal, 1);
          assert.equal(lease.replicas, 1);
          await waitFor('a confirmed renewal', () => lease._renewals >= 1, 5000);
          assert.equal(lease.state, 'held');
          assert.equal(lease.aofLocal, 1);
        } finally {
          await leases.close();
          await c.close();
        }
      });
    });
  });
}
