/**
 * Real servers for the tests: each in its own temp dir on a free port, the module
 * loaded, stopped by pid. The servers are the repo's test matrix, tests/servers.txt,
 * each binary from the server's variable there (LEASE_REDIS7_SERVER ..., which
 * clients/node/test sets); the module from LEASE_MODULE or
 * <repo>/target/release/libredis_lease.so.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';

import Redis, { Cluster } from 'ioredis';
import { createClient as createClient4, createCluster as createCluster4 } from 'redis4';
import { createClient as createClient5, createCluster as createCluster5 } from 'redis5';

export const PACKAGE_ROOT = resolve(__dirname, '..', '..');
export const REPO_ROOT = resolve(PACKAGE_ROOT, '..', '..');

/** A server's name in the matrix (`redis7`), which names its tests. */
export type Flavor = string;

/**
 * Each server of tests/servers.txt, in its order: name -> the variable that holds its
 * binary. A line's fields are name, variable, source, platform, binary and label.
 */
function readMatrix(): Record<Flavor, string> {
  const flavors: Record<Flavor, string> = {};
  for (const line of readFileSync(join(REPO_ROOT, 'tests', 'servers.txt'), 'utf8').split('\n')) {
    const [name, variable] = line.trim().split(/\s+/);
    if (!name || name.startsWith('#') || !variable) continue;
    flavors[name] = variable;
  }
  return flavors;
}

export const FLAVORS = readMatrix();

export function serverBinary(flavor: Flavor): string | undefined {
  const v = process.env[FLAVORS[flavor]];
  return v ? v : undefined;
}

export function modulePath(): string {
  const p = process.env.LEASE_MODULE || join(REPO_ROOT, 'target', 'release', 'libredis_lease.so');
  if (!existsSync(p)) throw new Error(`module not found at ${p} (cargo build --release --lib, or set LEASE_MODULE)`);
  return p;
}

export const monotonic = (): number => performance.now();

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `cond` every 5 ms until it is true; throws naming `what` after `timeoutMs`. */
export async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<number> {
  const start = monotonic();
  for (;;) {
    if (await cond()) return monotonic();
    if (monotonic() - start > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(5);
  }
}

async function portFree(port: number): Promise<boolean> {
  return new Promise((res) => {
    const srv = createServer();
    srv.once('error', () => res(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => res(true)));
  });
}

/** A port that is free, and whose cluster bus port (port + 10000) is free too. */
async function freePort(): Promise<number> {
  for (;;) {
    const port = 20000 + Math.floor(Math.random() * 30000);
    if ((await portFree(port)) && (await portFree(port + 10000))) return port;
  }
}

function ping(port: number): Promise<boolean> {
  return new Promise((res) => {
    const sock = connect(port, '127.0.0.1');
    let buf = '';
    const done = (ok: boolean): void => {
      sock.destroy();
      res(ok);
    };
    sock.setTimeout(500, () => done(false));
    sock.on('error', () => done(false));
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

export class Server {
  private constructor(
    readonly flavor: Flavor,
    readonly port: number,
    readonly dir: string,
    public proc: ChildProcess,
    private readonly argv: { bin: string; args: string[] },
  ) {}

  get pid(): number {
    return this.proc.pid!;
  }

  get log(): string {
    try {
      return readFileSync(join(this.dir, 'server.log'), 'utf8');
    } catch {
      return '(no log)';
    }
  }

  static async start(flavor: Flavor, opts: { cluster?: boolean; args?: string[] } = {}): Promise<Server> {
    const bin = serverBinary(flavor);
    if (!bin) throw new Error(`${FLAVORS[flavor]} is not set`);
    const so = modulePath();
    for (let attempt = 0; ; attempt++) {
      const port = await freePort();
      const dir = mkdtempSync(join(tmpdir(), `lease-node-${flavor}-`));
      const args = [
        '--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--logfile', 'server.log',
        '--save', '', '--appendonly', 'no', '--enable-debug-command', 'local', '--daemonize', 'no',
        '--loadmodule', so,
        ...(opts.cluster ? ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '5000'] : []),
        ...(opts.args ?? []),
      ];
      const proc = spawn(bin, args, { cwd: dir, stdio: 'ignore' });
      const server = new Server(flavor, port, dir, proc, { bin, args });
      let exited = false;
      proc.once('exit', () => (exited = true));
      const start = monotonic();
      while (!exited && monotonic() - start < 10_000) {
        if (await ping(port)) return server;
        await sleep(10);
      }
      const log = server.log;
      await server.stop();
      if (attempt < 3 && /Address already in use/.test(log)) continue;
      throw new Error(`${flavor} server on ${port} did not start:\n${log}`);
    }
  }

  /** Kills the server at once (SIGKILL), keeping its directory for a restart. */
  async crash(): Promise<void> {
    const proc = this.proc;
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((r) => proc.once('exit', () => r()));
    process.kill(this.pid, 'SIGKILL');
    await exited;
  }

  /** Starts the server again on the same port and directory (after `crash()`). */
  async restart(): Promise<void> {
    const proc = spawn(this.argv.bin, this.argv.args, { cwd: this.dir, stdio: 'ignore' });
    this.proc = proc;
    let exited = false;
    proc.once('exit', () => (exited = true));
    await waitFor(`${this.flavor} on ${this.port} to answer again`, async () => {
      if (exited) throw new Error(`${this.flavor} on ${this.port} exited on restart:\n${this.log}`);
      return ping(this.port);
    }, 10_000);
  }

  /** Stops the server by its pid (SIGCONT first, in case a test stopped it). */
  async stop(): Promise<void> {
    const proc = this.proc;
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise<void>((r) => proc.once('exit', () => r()));
      try {
        process.kill(this.pid, 'SIGCONT');
        process.kill(this.pid, 'SIGKILL');
      } catch {
        // already gone
      }
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }

  admin(): Redis {
    const r = new Redis({ host: '127.0.0.1', port: this.port, maxRetriesPerRequest: 3, lazyConnect: false });
    r.on('error', () => undefined);
    return r;
  }
}

/** A cluster of three masters on one binary. */
export class TestCluster {
  private constructor(readonly servers: Server[]) {}

  static async start(flavor: Flavor): Promise<TestCluster> {
    const servers = await Promise.all([0, 1, 2].map(() => Server.start(flavor, { cluster: true })));
    const c = new TestCluster(servers);
    try {
      const admins = servers.map((s) => s.admin());
      const ranges = [[0, 5460], [5461, 10922], [10923, 16383]];
      await Promise.all(admins.map((a, i) => a.call('CLUSTER', 'ADDSLOTSRANGE', ranges[i]![0]!, ranges[i]![1]!)));
      for (const s of servers.slice(1)) await admins[0]!.call('CLUSTER', 'MEET', '127.0.0.1', s.port);
      await waitFor('cluster state ok on every node', async () => {
        for (const a of admins) {
          const info = String(await a.call('CLUSTER', 'INFO'));
          if (!/cluster_state:ok/.test(info) || !/cluster_known_nodes:3/.test(info)) return false;
          const slots = (await a.call('CLUSTER', 'SLOTS')) as unknown[];
          if (slots.length !== 3) return false;
        }
        return true;
      }, 20_000);
      admins.forEach((a) => a.disconnect());
      return c;
    } catch (err) {
      await c.stop();
      throw err;
    }
  }

  get ports(): number[] {
    return this.servers.map((s) => s.port);
  }

  async stop(): Promise<void> {
    await Promise.all(this.servers.map((s) => s.stop()));
  }
}

export const CLIENT_KINDS = ['ioredis', 'node-redis4', 'node-redis5'] as const;
export type ClientKind = (typeof CLIENT_KINDS)[number];

export interface TestClient {
  client: unknown;
  close(): Promise<void>;
}

/** A connected client of `kind`; close() drops it without waiting for the server. */
export async function makeClient(kind: ClientKind, port: number): Promise<TestClient> {
  if (kind === 'ioredis') {
    const r = new Redis({ host: '127.0.0.1', port });
    r.on('error', () => undefined);
    await r.ping();
    return { client: r, close: async () => r.disconnect() };
  }
  const c = kind === 'node-redis4'
    ? createClient4({ socket: { host: '127.0.0.1', port } })
    : createClient5({ socket: { host: '127.0.0.1', port } });
  c.on('error', () => undefined);
  await c.connect();
  return {
    client: c,
    close: async () => {
      const any = c as unknown as { destroy?: () => void; disconnect: () => Promise<void> };
      if (typeof any.destroy === 'function') any.destroy();
      else await any.disconnect().catch(() => undefined);
    },
  };
}

export const CLUSTER_KINDS = ['ioredis', 'node-redis4', 'node-redis5'] as const;
export type ClusterKind = (typeof CLUSTER_KINDS)[number];

export async function makeClusterClient(kind: ClusterKind, ports: number[]): Promise<TestClient> {
  if (kind === 'ioredis') {
    const c = new Cluster(ports.map((port) => ({ host: '127.0.0.1', port })));
    c.on('error', () => undefined);
    await new Promise<void>((res, rej) => {
      c.once('ready', () => res());
      c.once('error', rej);
    });
    return { client: c, close: async () => c.disconnect() };
  }
  const rootNodes = ports.map((port) => ({ url: `redis://127.0.0.1:${port}` }));
  const c = kind === 'node-redis4' ? createCluster4({ rootNodes }) : createCluster5({ rootNodes });
  c.on('error', () => undefined);
  await c.connect();
  return {
    client: c,
    close: async () => {
      const any = c as unknown as { destroy?: () => void; disconnect: () => Promise<void> };
      if (typeof any.destroy === 'function') any.destroy();
      else await any.disconnect().catch(() => undefined);
    },
  };
}

/** LEASE.INFO as an object (RESP2 flat array), or null. */
export async function leaseInfo(admin: Redis, key: string): Promise<Record<string, unknown> | null> {
  const r = (await admin.call('LEASE.INFO', key)) as unknown[] | null;
  if (!r) return null;
  const out: Record<string, unknown> = {};
  for (let i = 0; i < r.length; i += 2) out[String(r[i])] = r[i + 1];
  return out;
}

/** Calls of `command` the server counted since its stats were reset. */
export async function commandCalls(admin: Redis, command: string): Promise<number> {
  const info = String(await admin.call('INFO', 'commandstats'));
  const m = new RegExp(`^cmdstat_${command.replace('.', '\\.')}:calls=(\\d+)`, 'm').exec(info);
  return m ? Number(m[1]) : 0;
}

/**
 * Bytes received and not yet read by the server on `port` (the rx queue of its accepted
 * connections in /proc/net/tcp): a stopped server's pending requests.
 */
export function unreadAt(port: number): number {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  let total = 0;
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 5 || !f[1]!.endsWith(hex) || f[3] !== '01') continue;
    total += parseInt(f[4]!.split(':')[1]!, 16);
  }
  return total;
}

/**
 * Runs `fn` with a server of its own (started with `args`) and an admin connection to
 * it; the server's log tail is added to a failure's message.
 */
export async function withServer<T>(
  flavor: Flavor,
  fn: (s: Server, admin: Redis) => Promise<T>,
  args: string[] = [],
): Promise<T> {
  const s = await Server.start(flavor, { args });
  const admin = s.admin();
  try {
    return await fn(s, admin);
  } catch (err) {
    if (err instanceof Error) err.message += `\n--- ${flavor} server log (tail) ---\n${s.log.split('\n').slice(-20).join('\n')}`;
    throw err;
  } finally {
    admin.disconnect();
    await s.stop();
  }
}
