/**
 * Sentinel as a first-class topology: a master and a replica with the module loaded,
 * three real Sentinels (`<server> sentinel.conf --sentinel`, quorum 2), and a failover
 * the Sentinels carry out while a lease is held. The watchdog renews through the client
 * the application gave (so it follows the Sentinels to the new master), and fenced
 * writes go to the master the Sentinels name.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';

import Redis from 'ioredis';
import { createClient as createClient5, createSentinel as createSentinel5 } from 'redis5';

import { Leases, type Lease } from '../src';
import { commandCalls, type Flavor, leaseInfo, Server, serverBinary, waitFor } from './harness';

const MASTER = 'leasemaster';

class SentinelProcess {
  private constructor(
    readonly port: number,
    readonly dir: string,
    readonly proc: ChildProcess,
  ) {}

  static async start(bin: string, port: number, masterPort: number): Promise<SentinelProcess> {
    const dir = mkdtempSync(join(tmpdir(), 'lease-node-sentinel-'));
    writeFileSync(
      join(dir, 'sentinel.conf'),
      [
        `port ${port}`,
        'bind 127.0.0.1',
        `dir ${dir}`,
        'logfile sentinel.log',
        `sentinel monitor ${MASTER} 127.0.0.1 ${masterPort} 2`,
        `sentinel down-after-milliseconds ${MASTER} 1000`,
        `sentinel failover-timeout ${MASTER} 5000`,
      ].join('\n') + '\n',
    );
    const proc = spawn(bin, [join(dir, 'sentinel.conf'), '--sentinel'], { cwd: dir, stdio: 'ignore' });
    const s = new SentinelProcess(port, dir, proc);
    const probe = s.client();
    try {
      await waitFor(`Sentinel on ${port}`, async () => (await probe.ping().catch(() => '')) === 'PONG', 10_000);
    } finally {
      probe.disconnect();
    }
    return s;
  }

  client(): Redis {
    const r = new Redis({ host: '127.0.0.1', port: this.port, maxRetriesPerRequest: 1, lazyConnect: false });
    r.on('error', () => undefined);
    return r;
  }

  get log(): string {
    try {
      return readFileSync(join(this.dir, 'sentinel.log'), 'utf8');
    } catch {
      return '(no log)';
    }
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      const exited = new Promise<void>((r) => this.proc.once('exit', () => r()));
      this.proc.kill('SIGKILL');
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A master, one replica and three Sentinels. */
class SentinelSet {
  constructor(
    readonly nodes: Server[],
    readonly sentinels: SentinelProcess[],
  ) {}

  static async start(flavor: Flavor): Promise<SentinelSet> {
    const bin = serverBinary(flavor)!;
    const master = await Server.start(flavor);
    const replica = await Server.start(flavor, { args: ['--replicaof', '127.0.0.1', String(master.port)] });
    const set = new SentinelSet([master, replica], []);
    try {
      const admin = replica.admin();
      try {
        await waitFor('the replica in sync', async () => /master_link_status:up/.test(String(await admin.info('replication'))), 20_000);
      } finally {
        admin.disconnect();
      }
      for (let i = 0; i < 3; i++) {
        // Sentinel ports next to the replica's, tried until one is free.
        for (let port = replica.port + 1 + i * 7; ; port++) {
          try {
            set.sentinels.push(await SentinelProcess.start(bin, port, master.port));
            break;
          } catch (err) {
            if (port > replica.port + 200) throw err;
          }
        }
      }
      await waitFor('Sentinels that see each other and the replica', async () => {
        for (const s of set.sentinels) {
          const c = s.client();
          try {
            const f = await sentinelMaster(c);
            if (Number(f['num-slaves']) < 1 || Number(f['num-other-sentinels']) < 2) return false;
          } finally {
            c.disconnect();
          }
        }
        return true;
      }, 30_000);
      return set;
    } catch (err) {
      await set.stop();
      throw err;
    }
  }

  get addresses(): Array<{ host: string; port: number }> {
    return this.sentinels.map((s) => ({ host: '127.0.0.1', port: s.port }));
  }

  /** The master's port as the first Sentinel names it. */
  async masterPort(): Promise<number> {
    const c = this.sentinels[0]!.client();
    try {
      const addr = (await c.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER)) as string[];
      return Number(addr[1]);
    } finally {
      c.disconnect();
    }
  }

  node(port: number): Server {
    const n = this.nodes.find((s) => s.port === port);
    if (!n) throw new Error(`no node on ${port}`);
    return n;
  }

  /** `SENTINEL FAILOVER`, then waits until every Sentinel names the new master and it has its replica. */
  async failover(): Promise<Server> {
    const old = await this.masterPort();
    const next = this.nodes.find((s) => s.port !== old)!;
    // On a loaded machine a Sentinel can abort its failover (-failover-abort-slave-timeout):
    // asked again, up to three times.
    for (let attempt = 1; ; attempt++) {
      const c = this.sentinels[0]!.client();
      try {
        await c.call('SENTINEL', 'FAILOVER', MASTER).catch((err: Error) => {
          if (!/INPROG/.test(err.message)) throw err;
        });
        await waitFor('the first Sentinel naming the new master', async () => {
          const addr = (await c.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER)) as string[];
          return Number(addr[1]) === next.port;
        }, 15_000);
        break;
      } catch (err) {
        if (attempt >= 3) throw err;
      } finally {
        c.disconnect();
      }
    }
    await waitFor('every Sentinel naming the new master', async () => {
      for (const s of this.sentinels) {
        const sc = s.client();
        try {
          const addr = (await sc.call('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER)) as string[];
          if (Number(addr[1]) !== next.port) return false;
        } finally {
          sc.disconnect();
        }
      }
      return true;
    }, 90_000);
    // The old master reconfigured as its replica, and done loading its data: a replica
    // still in its first sync can be acknowledged by WAIT (seen on Valkey 9) yet hold
    // nothing if it is promoted by the next failover. Waited for, but not required:
    // on Redis 8.2 a demoted master was seen still not in sync after 90 s, and what
    // this test checks (renewals and fenced writes follow the new master) does not
    // depend on it.
    await waitFor('the old master in sync as a replica', async () => {
      const a = this.node(old).admin();
      try {
        const info = String(await a.info('replication'));
        return /role:slave/.test(info) && new RegExp(`master_port:${next.port}\\b`).test(info) && /master_link_status:up/.test(info) && !/master_sync_in_progress:1/.test(info);
      } finally {
        a.disconnect();
      }
    }, 20_000).catch(() => undefined);
    return next;
  }

  async stop(): Promise<void> {
    await Promise.all([...this.sentinels.map((s) => s.stop()), ...this.nodes.map((n) => n.stop())]);
  }

  logs(): string {
    return this.sentinels.map((s, i) => `--- sentinel ${i} ---\n${s.log.split('\n').slice(-15).join('\n')}`).join('\n');
  }
}

async function sentinelMaster(c: Redis): Promise<Record<string, string>> {
  const flat = (await c.call('SENTINEL', 'MASTER', MASTER)) as string[];
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]!] = flat[i + 1]!;
  return out;
}

const SENTINEL_KINDS = ['ioredis', 'node-redis5'] as const;
type SentinelKind = (typeof SENTINEL_KINDS)[number];

async function sentinelClient(kind: SentinelKind, set: SentinelSet): Promise<{ leases: Leases; close(): Promise<void> }> {
  if (kind === 'ioredis') {
    const r = new Redis({ sentinels: set.addresses, name: MASTER });
    r.on('error', () => undefined);
    await r.ping();
    const leases = new Leases(r);
    return { leases, close: async () => (await leases.close(), r.disconnect()) };
  }
  const s = createSentinel5({ name: MASTER, sentinelRootNodes: set.addresses });
  s.on('error', () => undefined);
  await s.connect();
  // node-redis's Sentinel client cannot open a plain connection of its own: the Leases
  // are given createClient for the connections of fenced writes.
  const leases = new Leases(s, { createClient: createClient5, sentinelName: MASTER });
  return { leases, close: async () => (await leases.close(), await s.destroy()) };
}

let seq = 0;

export function defineSentinel(flavor: Flavor): void {
  if (!serverBinary(flavor)) return;
  describe(flavor, () => {
    describe('Sentinel (a master, a replica, three Sentinels)', { concurrency: 1 }, () => {
      let set: SentinelSet;
      before(async () => {
        set = await SentinelSet.start(flavor);
      });
      after(async () => {
        await set?.stop();
      });

      for (const kind of SENTINEL_KINDS) {
        it(`${kind}: renewed through the Sentinels' master and across a failover; fenced writes follow`, async () => {
          const key = `sentinel:${kind}:${process.pid}:${++seq}`;
          const { leases, close } = await sentinelClient(kind, set);
          let lease: Lease | undefined;
          try {
            // Longer than a failover takes (the promoted replica has the lease as last
            // replicated; the Sentinels name it a second or so after promoting it) and
            // than node-redis 5's Sentinel client takes to follow it (past 4 s once in a
            // CI run, on two shared cores).
            const ttl = 8000;
            lease = await leases.acquire(key, { ttlMs: ttl });
            await waitFor('a renewal', () => lease!._renewals >= 1, ttl);
            const oldPort = await set.masterPort();
            const oldMaster = set.node(oldPort);
            const oa = oldMaster.admin();
            try {
              // The replica has the grant before the failover starts.
              assert.equal(await oa.call('WAIT', '1', '2000'), 1);
            } finally {
              oa.disconnect();
            }
            const newMaster = await set.failover();
            const na = newMaster.admin();
            try {
              await na.call('CONFIG', 'RESETSTAT');
              // Renewed on the new master, three times: never lost.
              await waitFor('renewals on the new master', async () => (await commandCalls(na, 'lease.renew')) >= 3, 3 * ttl);
              assert.equal((await leaseInfo(na, key))?.state, 'held');
              assert.equal(lease.state === 'held' || lease.state === 'suspended', true, lease.state);
              assert.equal(lease.signal.aborted, false);
              // A fenced write goes to the master the Sentinels name now.
              assert.equal(await lease.fenceCall(`fence:${key}`, 'SET', `${key}:data`, 'after'), 'OK');
              assert.equal(await na.get(`${key}:data`), 'after');
              assert.equal(await lease.release(), true);
              assert.equal(await leaseInfo(na, key).then((i) => i?.state ?? 'free'), 'free');
            } finally {
              na.disconnect();
            }
          } catch (err) {
            if (err instanceof Error) err.message += `\n${set.logs()}`;
            throw err;
          } finally {
            await close();
          }
        });
      }
    });
  });
}
