/**
 * A fenced write is sent once and awaited no longer than the lease's time left: a server
 * that stalls or restarts while it is in flight makes it WriteIndeterminate by the
 * lease's deadline, and nothing sends it again afterwards (neither this client nor the
 * Redis library's queue or reconnect), unless the call asked for retries.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';

import { Lease, Leases, WriteIndeterminate } from '../src';
import {
  CLIENT_KINDS,
  commandCalls,
  type Flavor,
  makeClient,
  monotonic,
  Server,
  serverBinary,
  type TestClient,
  unreadAt,
  waitFor,
  withServer,
} from './harness';

/** Big enough to stand out among a stopped server's unread bytes (a renewal is < 100). */
const BODY = 'x'.repeat(2000);
/** A server that keeps its data across a crash: AOF, fsync on every write. */
const DURABLE = ['--appendonly', 'yes', '--appendfsync', 'always'];
/** Slack for timers on a loaded 2-core machine. */
const JITTER = 300;

/** The state letter of a process (R, S, T for stopped, ...). */
function processState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
}

let seq = 0;
const unique = (name: string): string => `${name}:${process.pid}:${++seq}`;

/** Acquires `key` and writes through its resource once, so the write's connection is open. */
async function leaseWithWrite(c: TestClient, key: string, ttlMs: number): Promise<{ leases: Leases; lease: Lease }> {
  const leases = new Leases(c.client);
  const lease = await leases.acquire(key, { ttlMs });
  assert.equal(Number(await lease.fenceCall(`fence:${key}`)), lease.fence);
  return { leases, lease };
}

/**
 * The server stops with the fenced write unread in its socket, is killed and restarted
 * on the same port with its data (AOF, fsync always): the lease survives, the write never
 * ran. Returns the write's outcome.
 */
async function writeAcrossARestart(
  s: Server,
  lease: Lease,
  key: string,
  retries: number,
): Promise<{ reply?: unknown; error?: unknown }> {
  const before = unreadAt(s.port);
  process.kill(s.pid, 'SIGSTOP');
  const outcome: { reply?: unknown; error?: unknown } = {};
  const write = lease
    .fenceCallWith(`fence:${key}`, ['RPUSH', `${key}:log`, BODY], { retries })
    .then((reply) => (outcome.reply = reply), (error: unknown) => (outcome.error = error));
  try {
    await waitFor("the write in the stopped server's socket", () => unreadAt(s.port) - before > 1000);
  } finally {
    await s.crash();
  }
  await s.restart();
  await write;
  return outcome;
}

export function defineFencedWrites(flavor: Flavor): void {
  if (!serverBinary(flavor)) return;
  describe(flavor, () => {
    describe('fenced writes expire with the lease', { concurrency: 1 }, () => {
      for (const kind of CLIENT_KINDS) {
        it(`${kind}: a write to a stalled server is indeterminate by the deadline, runs once, is never resent`, async () => {
          await withServer(flavor, async (s, admin) => {
            const c = await makeClient(kind, s.port);
            const key = unique('stall');
            const { leases, lease } = await leaseWithWrite(c, key, 600);
            try {
              await waitFor('a first renewal', () => lease._renewals >= 1);
              await admin.call('CONFIG', 'RESETSTAT');
              // The server answers nothing for 3 s (a stop-the-world stall, as DEBUG SLEEP 3):
              // past the lease's deadline.
              process.kill(s.pid, 'SIGSTOP');
              await waitFor('the server stopped', () => processState(s.pid) === 'T');
              const resume = setTimeout(() => process.kill(s.pid, 'SIGCONT'), 3000);
              const left = lease.deadline - monotonic();
              const start = monotonic();
              const err = await lease.fenceCall(`fence:${key}`, 'RPUSH', `${key}:log`, BODY).then(
                () => assert.fail('the write was answered during the stall'),
                (e: unknown) => e,
              );
              const took = monotonic() - start;
              const lostAt = monotonic();
              assert.ok(err instanceof WriteIndeterminate, String(err));
              assert.equal(err.attempts, 1);
              assert.equal(err.resource, `fence:${key}`);
              assert.ok(took <= left + JITTER, `took ${took} ms with ${left} ms left`);
              assert.equal(lease.state, 'lost');
              assert.ok(lease.signal.aborted);
              await waitFor('the server resumed', () => processState(s.pid) !== 'T', 5000);
              clearTimeout(resume);
              // Sent before the loss, it was in the sleeping server's socket: it runs once
              // when the server wakes, and nothing sends it again.
              await waitFor('the late write', async () => (await commandCalls(admin, 'lease.fence')) >= 1);
              assert.equal(await admin.ping(), 'PONG');
              assert.deepEqual(await admin.lrange(`${key}:log`, 0, -1), [BODY]);
              assert.equal(await commandCalls(admin, 'lease.fence'), 1);
              assert.ok(monotonic() >= lostAt);
            } finally {
              await leases.close();
              await c.close();
            }
          });
        });

        it(`${kind}: a write held by CLIENT PAUSE WRITE past the deadline is indeterminate and never runs`, async () => {
          await withServer(flavor, async (s, admin) => {
            const c = await makeClient(kind, s.port);
            const key = unique('paused');
            const { leases, lease } = await leaseWithWrite(c, key, 600);
            try {
              await waitFor('a first renewal', () => lease._renewals >= 1);
              await admin.call('CONFIG', 'RESETSTAT');
              // Writes wait (renewals too) for 2 s: past the lease's deadline.
              await admin.call('CLIENT', 'PAUSE', '2000', 'WRITE');
              const err = await lease.fenceCall(`fence:${key}`, 'RPUSH', `${key}:log`, BODY).then(
                () => assert.fail('the write was answered during the pause'),
                (e: unknown) => e,
              );
              assert.ok(err instanceof WriteIndeterminate, String(err));
              assert.equal(lease.state, 'lost');
              // Its connection was closed at the deadline, and a paused client that
              // disconnects never runs its command: nothing lands after the pause.
              await waitFor('the old connection gone', async () => !/cmd=lease\.fence/.test(String(await admin.call('CLIENT', 'LIST'))));
              await admin.call('CLIENT', 'UNPAUSE');
              assert.equal(await admin.call('SET', `${key}:probe`, '1'), 'OK');
              assert.deepEqual(await admin.lrange(`${key}:log`, 0, -1), []);
              assert.equal(await commandCalls(admin, 'lease.fence'), 0);
            } finally {
              await leases.close();
              await c.close();
            }
          });
        });

        it(`${kind}: a server restarted under a fenced write: indeterminate, not resent by the library's queue or reconnect`, async () => {
          await withServer(flavor, async (s, admin) => {
            const c = await makeClient(kind, s.port);
            const key = unique('restart');
            const { leases, lease } = await leaseWithWrite(c, key, 5000);
            try {
              const outcome = await writeAcrossARestart(s, lease, key, 0);
              assert.ok(outcome.error instanceof WriteIndeterminate, String(outcome.error ?? outcome.reply));
              assert.equal(outcome.error.attempts, 1);
              // The lease lives on disk: suspended by the failed write, held again once the
              // watchdog's renewal (through the reconnected client) is confirmed.
              await waitFor('held again', () => lease.state === 'held', 5000);
              // A new write goes through, and the lost one was never resent.
              assert.equal(await lease.fenceCall(`fence:${key}`, 'RPUSH', `${key}:log`, 'after'), 1);
              assert.deepEqual(await admin.lrange(`${key}:log`, 0, -1), ['after']);
              assert.equal(await commandCalls(admin, 'lease.fence'), 1);
            } finally {
              await leases.close();
              await c.close();
            }
          }, DURABLE);
        });

        it(`${kind}: retries resend a fenced write only when the call asks for them`, async () => {
          await withServer(flavor, async (s, admin) => {
            const c = await makeClient(kind, s.port);
            const key = unique('retry');
            const { leases, lease } = await leaseWithWrite(c, key, 5000);
            try {
              const outcome = await writeAcrossARestart(s, lease, key, 10);
              assert.equal(outcome.reply, 1, String(outcome.error));
              // The admin connection of withServer reconnected to the restarted server.
              assert.deepEqual(await admin.lrange(`${key}:log`, 0, -1), [BODY]);
              assert.equal(await commandCalls(admin, 'lease.fence'), 1);
            } finally {
              await leases.close();
              await c.close();
            }
          }, DURABLE);
        });
      }

      it('a fenced write on a lost lease sends nothing', async () => {
        await withServer(flavor, async (s, admin) => {
          const c = await makeClient('ioredis', s.port);
          const key = unique('gone');
          const leases = new Leases(c.client);
          try {
            const lease = await leases.acquire(key, { ttlMs: 200, autoRenew: false });
            await waitFor('lost at its deadline', () => lease.state === 'lost');
            await admin.call('CONFIG', 'RESETSTAT');
            await assert.rejects(lease.fenceCall(`fence:${key}`, 'SET', key + ':data', 'x'), /lost/);
            assert.equal(await commandCalls(admin, 'lease.fence'), 0);
          } finally {
            await leases.close();
            await c.close();
          }
        });
      });
    });
  });
}
