/**
 * The client's tests on one server flavor. Every test that touches the client runs for
 * ioredis 5, node-redis 4 and node-redis 5. Tests that stop, sleep or count the whole
 * server get a server of their own; the rest share one and use keys of their own.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import type Redis from 'ioredis';

import { Lease, LeaseLost, Leases, NotAcquired, StaleFence, type WatchdogStats } from '../src';
import {
  CLIENT_KINDS,
  CLUSTER_KINDS,
  type ClientKind,
  commandCalls,
  type Flavor,
  FLAVORS,
  leaseInfo,
  makeClient,
  makeClusterClient,
  monotonic,
  PACKAGE_ROOT,
  Server,
  serverBinary,
  sleep,
  TestCluster,
  type TestClient,
  waitFor,
  withServer,
} from './harness';

/** Slack for timer and scheduling jitter on a loaded 2-core machine. */
const JITTER = 300;

let seq = 0;
const unique = (name: string): string => `${name}:${process.pid}:${++seq}`;

/** A Leases over a fresh client of `kind`; `done()` closes both. */
async function open(kind: ClientKind, port: number): Promise<{ leases: Leases; c: TestClient; done(): Promise<void> }> {
  const c = await makeClient(kind, port);
  const leases = new Leases(c.client);
  return {
    leases,
    c,
    done: async () => {
      await leases.close();
      await c.close();
    },
  };
}

/** Resolves with the monotonic time the signal aborted. */
function abortedAt(signal: AbortSignal): Promise<number> {
  if (signal.aborted) return Promise.resolve(monotonic());
  return new Promise((res) => signal.addEventListener('abort', () => res(monotonic()), { once: true }));
}

/**
 * Runs `fn` (a read or reset of the server's counters) while the watchdog sends nothing,
 * so the server's count and the client's agree; returns the client's stats at that moment.
 */
async function quiet(leases: Leases, fn: () => Promise<unknown>): Promise<WatchdogStats> {
  for (;;) {
    await waitFor('no renewal in flight', () => leases._inflight === 0);
    const before = leases.stats;
    await fn();
    const after = leases.stats;
    if (after.renewalsSent === before.renewalsSent) return after;
  }
}

/** LEASE.INFO's state, `free` for a key without a lease record. */
async function stateOf(admin: Redis, key: string): Promise<string> {
  return String((await leaseInfo(admin, key))?.state ?? 'free');
}

/** Runs a compiled test script in a child process; its last line of output, or throws with all of it. */
async function runChild(script: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const path = script.includes('/') ? script : join(__dirname, script);
  const child = spawn(process.execPath, [path, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const code = await new Promise<number | null>((res) => child.once('exit', res));
  assert.equal(code, 0, `${script} failed:\n${out}`);
  return out.trim().split('\n').pop()!;
}

export function defineSuite(flavor: Flavor): void {
  const bin = serverBinary(flavor);
  if (!bin) {
    describe(flavor, () => {
      it(`${FLAVORS[flavor]} not set`, { skip: true }, () => undefined);
    });
    return;
  }

  // Three at a time: the suite's timing checks (a lease lost within its deadline plus
  // 300 ms) hold on two loaded cores at three, not always at six.
  describe(flavor, { concurrency: 3 }, () => {
    let shared: Server;
    let admin: Redis;
    before(async () => {
      shared = await Server.start(flavor);
      admin = shared.admin();
    });
    after(async () => {
      admin?.disconnect();
      await shared?.stop();
    });

    for (const kind of CLIENT_KINDS) {
      it(`${kind}: acquire with every option; NotAcquired; idempotent token; release`, async () => {
        const { leases, done } = await open(kind, shared.port);
        try {
          const key = unique('opts');
          const a = await leases.acquire(key, { ttlMs: 900, owner: 'worker-a' });
          assert.match(a.token, /^[0-9a-f]{32}$/);
          assert.ok(Number.isSafeInteger(a.fence) && a.fence > 0);
          assert.equal(a.state, 'held');
          const info = await leaseInfo(admin, key);
          assert.equal(info?.state, 'held');
          assert.equal(info?.fence, a.fence);
          assert.equal(info?.owner, 'worker-a');
          await assert.rejects(leases.acquire(key, { ttlMs: 900 }), NotAcquired);
          const again = await leases.acquire(key, { ttlMs: 900, token: a.token, owner: 'worker-a' });
          assert.equal(again.fence, a.fence, 'the same token is the idempotent retry');
          assert.equal(await a.release(), true);
          assert.equal(a.state, 'released');
          assert.equal(await a.release(), false);
          assert.equal(a.signal.aborted, false, 'a release is not a loss');

          const sem = unique('sem');
          const p1 = await leases.acquire(sem, { ttlMs: 900, shared: true, limit: 2 });
          const p2 = await leases.acquire(sem, { ttlMs: 900, shared: true, limit: 2 });
          await assert.rejects(leases.acquire(sem, { ttlMs: 900, shared: true, limit: 2 }), NotAcquired);
          assert.ok(p2.fence > p1.fence);
          assert.equal((await leaseInfo(admin, sem))?.holders, 2);
          await assert.rejects(leases.acquire(sem, { ttlMs: 900, shared: true, limit: 3 }), /LIMIT does not match/);

          const delayed = unique('delay');
          const d = await leases.acquire(delayed, { ttlMs: 300, delayMs: 60_000, autoRenew: false });
          const lostAt = await abortedAt(d.signal);
          assert.ok(d.signal.reason instanceof LeaseLost);
          await waitFor('the lock-delay', async () => (await leaseInfo(admin, delayed))?.state === 'delayed');
          assert.ok(lostAt > 0);
          await assert.rejects(leases.acquire(delayed, { ttlMs: 300 }), NotAcquired);
        } finally {
          await done();
        }
      });

      it(`${kind}: held past 3x its ttl while the body sleeps (same fence, renewed)`, async () => {
        const { leases, done } = await open(kind, shared.port);
        try {
          const key = unique('long');
          const ttl = 900;
          let fence = 0;
          const out = await leases.using(key, { ttlMs: ttl }, async (lease, signal) => {
            fence = lease.fence;
            const start = monotonic();
            // The body's own work: three ttls and a bit.
            await sleep(3 * ttl + 200);
            assert.ok(monotonic() - start > 3 * ttl);
            assert.equal(signal.aborted, false);
            assert.equal(lease.state, 'held');
            const info = await leaseInfo(admin, key);
            assert.equal(info?.state, 'held');
            assert.equal(info?.fence, fence, 'renewed, not re-granted');
            assert.ok(lease._renewals >= 6, `renewed ${lease._renewals} times`);
            return 'done';
          });
          assert.equal(out, 'done');
          assert.equal(await stateOf(admin, key), 'free');
        } finally {
          await done();
        }
      });

      it(`${kind}: lost within ttl/3 of an admin DEL; signalled; using() raises LeaseLost`, async () => {
        const { leases, done } = await open(kind, shared.port);
        try {
          const key = unique('del');
          const ttl = 900;
          let deletedAt = 0;
          let lostAt = 0;
          await assert.rejects(
            leases.using(key, { ttlMs: ttl }, async (_lease, signal) => {
              deletedAt = monotonic();
              await admin.del(key);
              lostAt = await abortedAt(signal);
              assert.ok(signal.reason instanceof LeaseLost);
            }),
            (err) => err instanceof LeaseLost && /refused the renewal/.test(err.message),
          );
          assert.ok(lostAt - deletedAt <= ttl / 3 + JITTER, `lost ${Math.round(lostAt - deletedAt)} ms after the DEL`);
        } finally {
          await done();
        }
      });

      it(`${kind}: lost unnoticed while the body ran: using() still raises LeaseLost`, async () => {
        const { leases, done } = await open(kind, shared.port);
        try {
          const key = unique('unnoticed');
          // A long ttl: the body ends long before the watchdog's next renewal.
          await assert.rejects(
            leases.using(key, { ttlMs: 30_000 }, async () => {
              await admin.del(key);
            }),
            (err) => err instanceof LeaseLost && /no longer held when released/.test(err.message),
          );
        } finally {
          await done();
        }
      });

      it(`${kind}: a body's exception releases the lease; NotAcquired skips the body`, async () => {
        const { leases, done } = await open(kind, shared.port);
        try {
          const key = unique('throw');
          await assert.rejects(
            leases.using(key, { ttlMs: 900 }, async () => {
              throw new Error('boom');
            }),
            /boom/,
          );
          assert.equal(await stateOf(admin, key), 'free');
          const holder = await leases.acquire(key, { ttlMs: 900 });
          let ran = false;
          await assert.rejects(
            leases.using(key, { ttlMs: 900 }, () => {
              ran = true;
            }),
            NotAcquired,
          );
          assert.equal(ran, false);
          await holder.release();
        } finally {
          await done();
        }
      });

      it(`${kind}: BLOCK hands the lease over between two clients; NotAcquired after the block timeout`, async () => {
        const a = await open(kind, shared.port);
        const b = await open(kind, shared.port);
        try {
          const key = unique('block');
          const first = await a.leases.acquire(key, { ttlMs: 900 });
          const waiting = b.leases.acquire(key, { ttlMs: 900, blockMs: 10_000 });
          await waitFor('the waiter', async () => (await leaseInfo(admin, key))?.waiters === 1);
          const releasedAt = monotonic();
          await first.release();
          const second = await waiting;
          assert.ok(monotonic() - releasedAt < 500);
          assert.ok(second.fence > first.fence);
          assert.equal(second.state, 'held');
          await assert.rejects(a.leases.acquire(key, { ttlMs: 900, blockMs: 200 }), NotAcquired);
          // A wait can be given up: the server drops the waiter with its connection.
          const ac = new AbortController();
          const gaveUp = a.leases.acquire(key, { ttlMs: 900, blockMs: 0, signal: ac.signal });
          await waitFor('the second waiter', async () => (await leaseInfo(admin, key))?.waiters === 1);
          ac.abort(new Error('no longer needed'));
          await assert.rejects(gaveUp, /no longer needed/);
          await waitFor('the waiter to leave', async () => (await leaseInfo(admin, key))?.waiters === 0);
          await second.release();
        } finally {
          await a.done();
          await b.done();
        }
      });

      it(`${kind}: StaleFence from a stale holder's write; using() treats it as lost`, async () => {
        const a = await open(kind, shared.port);
        const b = await open(kind, shared.port);
        try {
          const key = unique('stale');
          const res = unique('res');
          const data = unique('data');
          await assert.rejects(
            a.leases.using(key, { ttlMs: 30_000 }, async (lease, signal) => {
              assert.equal(await lease.fenceCall(res, 'SET', data, 'a1'), 'OK');
              // An operator (or an expiry A slept through) ends A's lease; B takes it and writes.
              await admin.del(key);
              const bl = await b.leases.acquire(key, { ttlMs: 900 });
              assert.ok(bl.fence > lease.fence);
              await bl.fenceCall(res, 'SET', data, 'b1');
              await assert.rejects(lease.fenceCall(res, 'SET', data, 'a2'), (err) => {
                assert.ok(err instanceof StaleFence);
                assert.equal(err.fence, lease.fence);
                assert.equal(err.highest, bl.fence);
                return true;
              });
              assert.equal(signal.aborted, true);
              assert.ok((signal.reason as LeaseLost).cause instanceof StaleFence);
              assert.equal(lease.state, 'lost');
              await assert.rejects(lease.fenceCall(res, 'SET', data, 'a3'), LeaseLost);
              await bl.release();
            }),
            (err) => err instanceof LeaseLost && (err.cause as Error) instanceof StaleFence,
          );
          assert.equal(await admin.get(data), 'b1');
        } finally {
          await a.done();
          await b.done();
        }
      });

      it(`${kind}: caps: maxRenewals and maxHoldMs stop renewing, then lost at the deadline`, async () => {
        const { leases, done } = await open(kind, shared.port);
        try {
          const r = await leases.acquire(unique('caps'), { ttlMs: 600, maxRenewals: 2 });
          await abortedAt(r.signal);
          assert.equal(r._renewals, 2);
          const start = monotonic();
          const h = await leases.acquire(unique('caps'), { ttlMs: 900, maxHoldMs: 1200 });
          const lostAt = await abortedAt(h.signal);
          // The renewals asked for less as the cap neared: the deadline is the cap.
          assert.ok(lostAt - start >= 1200 - 50 && lostAt - start <= 1200 + JITTER, `lost after ${Math.round(lostAt - start)} ms`);
          await waitFor('the key to be free', async () => (await stateOf(admin, h.key)) !== 'held', 1000);
        } finally {
          await done();
        }
      });

      it(`${kind}: a worker paused past its lease cannot damage the resource (seed scenario)`, async () => {
        // The pause stops a whole event loop, so worker A runs in a process of its own.
        const key = unique('pause');
        const data = unique('data');
        const out = await runChild('pause-child.js', [kind, String(shared.port), key, unique('res'), data]);
        assert.deepEqual(JSON.parse(out), { outcome: 'LeaseLost', stateAfterPause: 'lost', secondWrite: 'LeaseLost' });
        assert.equal(await admin.get(data), 'b: all');
      });
    }

    for (const kind of CLIENT_KINDS) {
      it(`${kind}: lost when another holder takes it after a DEBUG SLEEP; using() raises LeaseLost`, async () => {
        await withServer(flavor, async (s, adm) => {
          const a = await open(kind, s.port);
          const b = await open(kind, s.port);
          try {
            const key = unique('sleep');
            const ttl = 600;
            let bGotAt = 0;
            let bFence = 0;
            let lostAt = 0;
            await assert.rejects(
              a.leases.using(key, { ttlMs: ttl }, async (lease, signal) => {
                const taken = b.leases.acquire(key, { ttlMs: 5000, blockMs: 10_000 }).then((l) => {
                  bGotAt = monotonic();
                  bFence = l.fence;
                  return l;
                });
                await waitFor('B to wait', async () => (await leaseInfo(adm, key))?.waiters === 1);
                const sleeper = s.admin();
                await sleeper.call('DEBUG', 'SLEEP', String((3 * ttl) / 1000));
                sleeper.disconnect();
                lostAt = await abortedAt(signal);
                await (await taken).release();
                assert.ok(bFence > lease.fence);
              }),
              LeaseLost,
            );
            assert.ok(lostAt <= bGotAt + ttl / 3 + JITTER, `lost ${Math.round(lostAt - bGotAt)} ms after B got it`);
          } finally {
            await a.done();
            await b.done();
          }
        });
      });

      it(`${kind}: suspended while the server is unreachable (SIGSTOP), lost at the confirmed deadline, never back`, async () => {
        await withServer(flavor, async (s) => {
          const { leases, done } = await open(kind, s.port);
          let stopped = false;
          try {
            const ttl = 900;
            const lease = await leases.acquire(unique('stop'), { ttlMs: ttl });
            const long = await leases.acquire(unique('stop'), { ttlMs: 60_000 });
            await waitFor('a renewal', () => lease._renewals >= 1);
            process.kill(s.pid, 'SIGSTOP');
            stopped = true;
            const stoppedAt = monotonic();
            await waitFor('suspended', () => lease.state === 'suspended', 2 * ttl);
            assert.equal(lease.signal.aborted, false);
            const deadline = lease.deadline;
            assert.ok(deadline <= stoppedAt + ttl, 'the deadline counts from a renewal sent before the stop');
            const lostAt = await abortedAt(lease.signal);
            assert.equal(lease.state, 'lost');
            assert.ok(lostAt >= deadline - 1 && lostAt <= deadline + JITTER, `lost ${Math.round(lostAt - deadline)} ms after the deadline`);
            // close() does not wait for an unreachable server past its timeout.
            const closing = monotonic();
            await leases.close({ timeoutMs: 300 });
            assert.ok(monotonic() - closing < 300 + JITTER);
            assert.equal(long.state, 'released');
            process.kill(s.pid, 'SIGCONT');
            stopped = false;
            // The renewal that hung is answered now; the lease stays lost.
            await waitFor('the hung renewal to settle', () => lease._inflightSince < 0, 5000);
            assert.equal(lease.state, 'lost');
            await assert.rejects(lease.renew(), LeaseLost);
          } finally {
            if (stopped) process.kill(s.pid, 'SIGCONT');
            await done();
          }
        });
      });

      it(`${kind}: using() whose body ends while the server is unreachable returns at the deadline`, async () => {
        await withServer(flavor, async (s) => {
          const { leases, done } = await open(kind, s.port);
          let stopped = false;
          try {
            const ttl = 900;
            let held: Lease | undefined;
            let stoppedAt = 0;
            const out = await leases.using(unique('unreachable'), { ttlMs: ttl }, async (lease) => {
              held = lease;
              await waitFor('a renewal', () => lease._renewals >= 1);
              process.kill(s.pid, 'SIGSTOP');
              stopped = true;
              stoppedAt = monotonic();
              return 'done';
            });
            // The body finished under a valid lease; the release could not be answered.
            assert.equal(out, 'done');
            assert.equal(held!.state, 'lost');
            assert.ok(monotonic() - stoppedAt <= ttl + JITTER);
          } finally {
            if (stopped) process.kill(s.pid, 'SIGCONT');
            await done();
          }
        });
      });

      it(`${kind}: 1,000 leases cost at most one pipelined batch of renewals per ttl/3`, async () => {
        await withServer(flavor, async (s, adm) => {
          const { leases, done } = await open(kind, s.port);
          try {
            const ttl = 1500;
            const n = 1000;
            const held = await Promise.all(Array.from({ length: n }, (_, i) => leases.acquire(`many:${i}`, { ttlMs: ttl })));
            // Counting starts after a first batch, when nothing is in flight.
            const b0 = leases.stats.renewalBatches;
            await waitFor('a batch', () => leases.stats.renewalBatches > b0, 3 * ttl);
            const s0 = await quiet(leases, () => adm.call('CONFIG', 'RESETSTAT'));
            const start = monotonic();
            await waitFor('three more batches', () => leases.stats.renewalBatches >= s0.renewalBatches + 3, 5 * ttl);
            let calls = 0;
            const s1 = await quiet(leases, async () => {
              calls = await commandCalls(adm, 'lease.renew');
            });
            const elapsed = monotonic() - start;
            const batches = s1.renewalBatches - s0.renewalBatches;
            const intervals = elapsed / (ttl / 3);
            assert.equal(calls, s1.renewalsSent - s0.renewalsSent, 'the server saw every renewal sent, and no other');
            assert.ok(batches <= intervals + 1, `${batches} batches in ${Math.round(elapsed)} ms`);
            assert.ok(calls <= n * (intervals + 1), `${calls} renewals in ${Math.round(elapsed)} ms`);
            assert.ok(calls >= n * batches * 0.5, `${calls} renewals in ${batches} batches: most leases ride in every batch`);
            assert.ok(held.every((l) => l.state === 'held'));
          } finally {
            await done();
          }
        });
      });

      it(`${kind}: a session keeps 1,000 leases with one renewal; its end loses them all`, async () => {
        await withServer(flavor, async (s, adm) => {
          const { leases, done } = await open(kind, s.port);
          try {
            const ttl = 900;
            const n = 1000;
            const session = await leases.session(ttl);
            const holds = await Promise.all(Array.from({ length: n }, (_, i) => leases.acquire(`bound:${i}`, { session })));
            assert.equal(session.holds, n);
            assert.ok(holds.every((h) => h.ttlMs === 0 && h.session === session));
            const s0 = await quiet(leases, () => adm.call('CONFIG', 'RESETSTAT'));
            await waitFor('three session renewals', () => leases.stats.renewalsSent >= s0.renewalsSent + 3 && session._inflightSince < 0, 5 * ttl);
            let calls = 0;
            const s1 = await quiet(leases, async () => {
              calls = await commandCalls(adm, 'lease.renew');
            });
            assert.equal(s1.renewalBatches - s0.renewalBatches, s1.renewalsSent - s0.renewalsSent, 'each batch is the one session renewal');
            assert.equal(calls, s1.renewalsSent - s0.renewalsSent, 'one LEASE.RENEW per interval keeps all 1,000');
            assert.equal((await leaseInfo(adm, 'bound:999'))?.state, 'held');
            assert.equal((await leaseInfo(adm, session.key))?.bound, n);
            assert.ok(holds.every((h) => h.state === 'held'));
            // The session's end (here an operator's DEL) ends every hold bound to it.
            const deletedAt = monotonic();
            await adm.del(session.key);
            const lostAt = await abortedAt(holds[n - 1]!.signal);
            assert.ok(lostAt - deletedAt <= ttl / 3 + JITTER);
            assert.ok(holds.every((h) => h.state === 'lost' && h.signal.reason instanceof LeaseLost));
            assert.equal(await stateOf(adm, 'bound:0'), 'free');
          } finally {
            await done();
          }
        });
      });

      it(`${kind}: close() releases what is held and leaves no timer behind`, async () => {
        const out = await runChild('close-child.js', [kind, String(shared.port)]);
        const report = JSON.parse(out) as { keys: string[]; timersDuring: number };
        assert.ok(report.timersDuring >= 1, 'the watchdog had a timer while leases were held');
        for (const key of report.keys) assert.equal(await stateOf(admin, key), 'free');
      });
    }

    it('examples/paused-worker.js: the paused worker cannot damage the report', async () => {
      const out = await runChild(join(PACKAGE_ROOT, 'examples', 'paused-worker.js'), [], { ...process.env, REDIS_PORT: String(shared.port) });
      assert.match(out, /^intact/);
      const report = await admin.lrange('report', 0, -1);
      assert.deepEqual(report, ['A step 1', 'A step 2', 'B step 1', 'B step 2', 'B step 3', 'B step 4']);
    });

    it('examples/fence-sqlite.js: the database refuses the stale write', async () => {
      const out = await runChild(join(PACKAGE_ROOT, 'examples', 'fence-sqlite.js'), [], { ...process.env, REDIS_PORT: String(shared.port) });
      assert.match(out, /"v2 by B" at fence \d+$/);
    });

    it('sessions: binding errors; a bound hold with a ttl of its own; release of the session', async () => {
      const { leases, done } = await open('ioredis', shared.port);
      try {
        const session = await leases.session(900, { key: unique('{w7}session') });
        const own = await leases.acquire(unique('{w7}job'), { session, ttlMs: 900 });
        const bound = await leases.acquire(unique('{w7}job'), { session });
        await waitFor('renewals of the session and of the hold with a ttl', () => session._renewals >= 1 && own._renewals >= 1);
        assert.equal(bound._renewals, 0, 'a hold bound with ttl 0 is never renewed by itself');
        await assert.rejects(leases.acquire(session.key, { session }), /cannot be bound to itself/);
        assert.equal(await session.release(), true);
        assert.equal(bound.state, 'lost');
        assert.equal(own.state, 'lost');
        assert.match((bound.signal.reason as LeaseLost).message, /session .* was released/);
        await assert.rejects(leases.acquire(unique('{w7}job'), { session }), /was released/);
      } finally {
        await done();
      }
    });

    describe('cluster (3 masters, hash tags)', { concurrency: true }, () => {
      let cluster: TestCluster;
      before(async () => {
        cluster = await TestCluster.start(flavor);
      });
      after(async () => {
        await cluster?.stop();
      });
      for (const kind of CLUSTER_KINDS) {
        it(`${kind} cluster: leases on every node, fenced writes, a session with its holds, renewals across nodes`, async () => {
          const c = await makeClusterClient(kind, cluster.ports);
          const leases = new Leases(c.client);
          try {
            const tags = ['a', 'b', 'c', 'd', 'e', 'f'].map((t) => `${kind}-${t}`);
            const held: Lease[] = [];
            for (const tag of tags) {
              const lease = await leases.acquire(`{${tag}}lock`, { ttlMs: 600 });
              assert.equal(await lease.fenceCall(`{${tag}}fence`, 'SET', `{${tag}}data`, String(lease.fence)), 'OK');
              held.push(lease);
            }
            const session = await leases.session(600, { key: `{${kind}-w7}session` });
            const holds = await Promise.all([1, 2, 3].map((i) => leases.acquire(`{${kind}-w7}job:${i}`, { session })));
            await assert.rejects(leases.acquire(`{${kind}-other}job`, { session }), /CROSSSLOT|slot/i);
            const b0 = leases.stats.renewalBatches;
            await waitFor('two rounds of renewals', () => leases.stats.renewalBatches >= b0 + 2 && held.every((l) => l._renewals >= 2), 3000);
            assert.ok([...held, session, ...holds].every((l) => l.state === 'held'));
            const blocked = leases.acquire(`{${tags[0]}}lock`, { ttlMs: 600, blockMs: 5000 });
            await held[0]!.release();
            const next = await blocked;
            assert.ok(next.fence > held[0]!.fence);
          } finally {
            await leases.close();
            await c.close();
          }
        });
      }
    });
  });
}
