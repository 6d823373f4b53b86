import { performance } from 'node:perf_hooks';

/**
 * Adapters: the few things Leases needs from a Redis client. One for ioredis 5
 * (`Redis` and `Cluster`), one for node-redis 4 and 5 (`createClient`, `createCluster`).
 * Any other client can be used by implementing `LeaseAdapter`.
 */

export type Arg = string | number | Buffer;

/** One command of a batch: `key` routes it in a cluster; `args` starts with the name. */
export interface BatchItem {
  key: string;
  args: Arg[];
}

/** The outcome of one command of a batch: its reply, or the error it got. */
export type BatchResult = { ok: true; value: unknown } | { ok: false; error: unknown };

export interface LeaseAdapter {
  /** Send one command on the shared connection. */
  call(key: string, args: Arg[]): Promise<unknown>;
  /** Send many commands at once, pipelined; one result per item, in order. */
  batch(items: BatchItem[]): Promise<BatchResult[]>;
  /**
   * Send a command that may block (`LEASE.ACQUIRE ... BLOCK`) on a connection of its own,
   * so it does not hold up renewals queued behind it. Aborting `signal` closes that
   * connection (the server drops the waiter) and rejects with the signal's reason.
   */
  blocking(key: string, args: Arg[], signal: AbortSignal): Promise<unknown>;
  /**
   * Optional: which server a key's commands go to (any string that is equal for two keys
   * on the same server). Batches put one `WAIT` after each server's commands. Without
   * it, every key is taken to live on one server.
   */
  nodeOf?(key: string): string;
  /**
   * Optional: `blocking`, then `after` on the same connection in the same round trip
   * (sent without waiting for the first reply); resolves with both replies. Without it,
   * blocking acquires cannot be confirmed by replicas.
   */
  blockingThen?(key: string, args: Arg[], after: Arg[], signal: AbortSignal): Promise<[unknown, unknown]>;
  /** True for an error the server replied (as opposed to a connection failure). */
  isReplyError(err: unknown): boolean;
  /**
   * Send one command exactly once on a connection of the adapter's own that neither
   * queues while disconnected nor resends after a reconnect, to the server the client
   * would route `key` to, and wait at most `timeoutMs` for the reply. A reply error
   * rejects as is (the command did not run; `READONLY` excepted, see below). Anything
   * else rejects with `Unanswered`: `sent` says whether the command may have reached the
   * server. On a timeout the connection is closed, so the command can never be sent
   * later. A `READONLY` reply (a master demoted by a failover) is an `Unanswered` that
   * was not sent, and the next call asks the topology for the master again.
   */
  once(key: string, args: Arg[], timeoutMs: number): Promise<unknown>;
  /** Close the connections the adapter opened itself (never the client it was given). */
  close(): Promise<void>;
}

/** A command of `LeaseAdapter.once` that got no reply. */
export class Unanswered extends Error {
  constructor(
    message: string,
    /** The command may have reached the server (it was written to a connection). */
    readonly sent: boolean,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'Unanswered';
  }
}

function isReadonly(err: unknown): boolean {
  return isServerReplyError(err) && /^READONLY/.test((err as Error).message);
}

/**
 * The connections of `once()`: one per server address (`''` outside a cluster), opened
 * on first use, dropped on any failure so that the next call opens a fresh one (which,
 * under Sentinel, asks the Sentinels where the master is).
 */
class OnceConnections<C> {
  private readonly conns = new Map<string, Promise<C>>();
  private closed = false;

  constructor(
    private readonly open: (address: string) => Promise<C>,
    private readonly send: (conn: C, args: Arg[]) => Promise<unknown>,
    private readonly kill: (conn: C) => void,
  ) {}

  private drop(address: string, conn: Promise<C>): void {
    if (this.conns.get(address) === conn) this.conns.delete(address);
    conn.then(this.kill, () => undefined);
  }

  run(address: string, args: Arg[], timeoutMs: number): Promise<unknown> {
    return this.with(address, (conn) => this.send(conn, args), timeoutMs);
  }

  /** Drops the connection to `address` (a demoted master's, say) if there is one. */
  forget(address: string): void {
    const conn = this.conns.get(address);
    if (conn) this.drop(address, conn);
  }

  /** Runs `fn` on the connection to `address` (opened if need be) within `timeoutMs`. */
  async with<T>(address: string, fn: (conn: C) => Promise<T>, timeoutMs: number): Promise<T> {
    if (this.closed) throw new Unanswered('redis-lease: adapter closed', false);
    let timer: NodeJS.Timeout | undefined;
    let timedOut = false;
    const deadline = new Promise<'timeout'>((res) => {
      timer = setTimeout(() => {
        timedOut = true;
        res('timeout');
      }, Math.max(0, timeoutMs));
    });
    let conn = this.conns.get(address);
    if (!conn) {
      conn = this.open(address);
      conn.catch(() => undefined);
      this.conns.set(address, conn);
    }
    let sent = false;
    try {
      let ready: C;
      try {
        const c = await Promise.race([conn, deadline]);
        if (c === 'timeout') throw new Error(`no connection within ${timeoutMs} ms`);
        ready = c;
      } catch (error) {
        this.drop(address, conn);
        throw new Unanswered(`redis-lease: could not connect: ${String(error)}`, false, { cause: error });
      }
      const reply = fn(ready);
      sent = true;
      reply.catch(() => undefined);
      const r = await Promise.race([reply, deadline]);
      if (r === 'timeout' && timedOut) {
        this.drop(address, conn);
        throw new Unanswered(`redis-lease: no reply within ${timeoutMs} ms`, true);
      }
      return r as T;
    } catch (error) {
      if (error instanceof Unanswered) throw error;
      if (isReadonly(error)) {
        this.drop(address, conn);
        throw new Unanswered(`redis-lease: ${(error as Error).message}`, false, { cause: error });
      }
      if (isServerReplyError(error)) throw error;
      this.drop(address, conn);
      // Refused before writing (no offline queue) means it was not sent.
      const notWritten = /enableOfflineQueue|offline|isn't writeable|client is closed/i.test(String(error));
      throw new Unanswered(`redis-lease: ${String(error)}`, sent && !notWritten, { cause: error });
    } finally {
      clearTimeout(timer);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    const all = [...this.conns.values()];
    this.conns.clear();
    for (const c of all) c.then(this.kill, () => undefined);
    await Promise.allSettled(all);
  }
}

function hasMethod(obj: unknown, name: string): boolean {
  return typeof obj === 'object' && obj !== null && typeof (obj as Record<string, unknown>)[name] === 'function';
}

/** A reply error in either client: ioredis `ReplyError`, node-redis `ErrorReply` and subclasses. */
export function isServerReplyError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  for (let p: object | null = Object.getPrototypeOf(err); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = (p as { constructor?: { name?: string } }).constructor?.name;
    if (name === 'ReplyError' || name === 'ErrorReply') return true;
  }
  return false;
}

function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new Error('aborted');
}

/** Idle blocking connections kept for the next blocking acquire. */
const IDLE_BLOCKING_CONNECTIONS = 4;

/**
 * A small pool of dedicated connections for blocking commands. `open` makes one that
 * is ready to send, `send` sends on it, `quit` closes it politely, `kill` at once.
 */
class BlockingPool<C> {
  private idle: C[] = [];
  private busy = new Set<C>();
  private closed = false;

  constructor(
    private readonly open: () => Promise<C>,
    private readonly send: (conn: C, key: string, args: Arg[]) => Promise<unknown>,
    private readonly quit: (conn: C) => Promise<void>,
    private readonly kill: (conn: C) => void,
  ) {}

  async run(key: string, args: Arg[], signal: AbortSignal): Promise<unknown> {
    return this.runThen(key, args, undefined, signal);
  }

  /** `run`, with `after` sent right behind `args` on the same connection; both replies when given. */
  async runThen(key: string, args: Arg[], after: Arg[] | undefined, signal: AbortSignal): Promise<unknown> {
    if (this.closed) throw new Error('redis-lease: adapter closed');
    if (signal.aborted) throw abortError(signal);
    const conn = this.idle.pop() ?? (await this.open());
    this.busy.add(conn);
    let onAbort: (() => void) | undefined;
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => {
        reject(abortError(signal));
        // The server drops a blocked client's place in the queue when it disconnects.
        this.busy.delete(conn);
        this.kill(conn);
      };
      signal.addEventListener('abort', onAbort, { once: true });
    });
    aborted.catch(() => undefined);
    try {
      if (signal.aborted) onAbort?.();
      const first = this.send(conn, key, args);
      const replies = after ? Promise.all([first, this.send(conn, key, after)]) : first;
      const reply = await Promise.race([replies, aborted]);
      return reply;
    } catch (err) {
      if (this.busy.delete(conn)) this.kill(conn);
      throw signal.aborted ? abortError(signal) : err;
    } finally {
      if (onAbort) signal.removeEventListener('abort', onAbort);
      if (this.busy.delete(conn)) {
        if (!this.closed && this.idle.length < IDLE_BLOCKING_CONNECTIONS) this.idle.push(conn);
        else void this.quit(conn).catch(() => undefined);
      }
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const conn of this.busy) this.kill(conn);
    this.busy.clear();
    const idle = this.idle;
    this.idle = [];
    await Promise.all(idle.map((c) => this.quit(c).catch(() => this.kill(c))));
  }
}

/**
 * What the three adapters share: a pool of connections for blocking commands and the
 * connections of `once()`, both opened by the adapter and closed by `close()`.
 */
abstract class OwnConnections<P, D> {
  /** @internal */
  protected abstract readonly pool: BlockingPool<P>;
  /** @internal */
  protected abstract readonly direct: OnceConnections<D>;

  blocking(key: string, args: Arg[], signal: AbortSignal): Promise<unknown> {
    return this.pool.run(key, args, signal);
  }

  async blockingThen(key: string, args: Arg[], after: Arg[], signal: AbortSignal): Promise<[unknown, unknown]> {
    return (await this.pool.runThen(key, args, after, signal)) as [unknown, unknown];
  }

  isReplyError(err: unknown): boolean {
    return isServerReplyError(err);
  }

  async close(): Promise<void> {
    await Promise.all([this.pool.close(), this.direct.close()]);
  }
}

// ---------------------------------------------------------------- ioredis

/** The ioredis options this adapter reads to follow a Sentinel-managed master. */
interface IoSentinelOptions {
  sentinels?: Array<{ host?: string; port?: number }> | null;
  name?: string;
  sentinelUsername?: string;
  sentinelPassword?: string;
}

const NO_RETRY = {
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 0,
  retryStrategy: () => null,
  sentinelRetryStrategy: () => null,
  reconnectOnError: () => false,
  lazyConnect: true,
};

/**
 * Which server the Sentinels of an ioredis client name as the master, asked as ioredis
 * asks (each Sentinel in turn, the first answer wins), on connections of its own that
 * never wait longer than the time given.
 */
class SentinelView {
  constructor(
    private readonly addresses: () => string[],
    private readonly name: string,
    private readonly conns: OnceConnections<unknown>,
  ) {}

  /** The master's `host:port`, or undefined when no Sentinel names one within `timeoutMs`. */
  async master(timeoutMs: number): Promise<string | undefined> {
    const until = performance.now() + timeoutMs;
    for (const address of this.addresses()) {
      const left = until - performance.now();
      if (left <= 0) break;
      try {
        const r = (await this.conns.run(address, ['SENTINEL', 'GET-MASTER-ADDR-BY-NAME', this.name], left)) as
          | string[]
          | null;
        if (Array.isArray(r) && r.length >= 2) return `${r[0]}:${r[1]}`;
      } catch {
        // this Sentinel does not answer or know the name: ask the next
      }
    }
    return undefined;
  }

  close(): Promise<void> {
    return this.conns.close();
  }
}

/** The Sentinels of an ioredis client, asked on connections made like the client's own. */
function ioSentinelView(client: IoRedisLike, options: IoSentinelOptions): SentinelView {
  const addresses = (options.sentinels ?? []).map((s) => `${s.host ?? '127.0.0.1'}:${s.port ?? 26379}`);
  const conns = new OnceConnections<IoRedisLike>(
    async (address) => {
      const [host, port] = splitAddress(address);
      const conn = (client as unknown as { duplicate(o: object): IoRedisLike & { connect(): Promise<void> } }).duplicate({
        ...NO_RETRY,
        sentinels: null,
        host,
        port,
        db: 0,
        username: options.sentinelUsername,
        password: options.sentinelPassword,
        enableReadyCheck: false,
      });
      conn.on('error', () => undefined);
      await conn.connect();
      return conn;
    },
    (conn, args) => conn.call(String(args[0]), ...args.slice(1)),
    (conn) => conn.disconnect(),
  );
  return new SentinelView(() => addresses, options.name ?? 'mymaster', conns as OnceConnections<unknown>);
}

/** How long a renewal batch or a Sentinel question may take before its connection is dropped. */
const SENTINEL_BATCH_TIMEOUT_MS = 5000;

/** The parts of an ioredis `Redis` or `Cluster` this adapter uses. */
export interface IoRedisLike {
  call(command: string, ...args: Arg[]): Promise<unknown>;
  pipeline(): IoRedisPipelineLike;
  duplicate(): IoRedisLike;
  sendCommand(command: unknown): unknown;
  quit(): Promise<unknown>;
  disconnect(): void;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  isCluster?: boolean;
  status?: string;
}

export interface IoRedisPipelineLike {
  call(command: string, ...args: Arg[]): unknown;
  sendCommand(command: unknown): unknown;
  exec(): Promise<Array<[Error | null, unknown]> | null>;
}

interface IoCommand {
  promise: Promise<unknown>;
  keys?: Arg[];
}
type IoCommandCtor = new (name: string, args: Arg[], options: { replyEncoding: string }) => IoCommand;

export function isIoRedis(client: unknown): client is IoRedisLike {
  return hasMethod(client, 'pipeline') && hasMethod(client, 'call') && hasMethod(client, 'duplicate');
}

/** CRC16 (XMODEM) of the hash-tagged part of a key: its cluster slot. */
export function keySlot(key: string): number {
  let s = key.indexOf('{');
  if (s >= 0) {
    const e = key.indexOf('}', s + 1);
    if (e > s + 1) key = key.slice(s + 1, e);
  }
  const bytes = Buffer.from(key);
  let crc = 0;
  for (const b of bytes) {
    crc ^= b << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

/**
 * ioredis routes a command in a cluster by the keys its static command table names, and
 * the LEASE commands are not in it. In a cluster the adapter builds each command itself
 * and names its key, so ioredis routes it (and follows MOVED/ASK) as it does GET.
 */
export class IoRedisAdapter extends OwnConnections<IoRedisLike, IoRedisLike> implements LeaseAdapter {
  private readonly cluster: boolean;
  private commandCtor: IoCommandCtor | undefined;
  /** @internal */
  protected readonly pool: BlockingPool<IoRedisLike>;
  /** @internal */
  protected readonly direct: OnceConnections<IoRedisLike>;
  /** Under Sentinel: the Sentinels, asked before every renewal batch and fenced write. */
  private readonly sentinel: SentinelView | undefined;

  constructor(
    private readonly client: IoRedisLike,
    options: { Command?: unknown } = {},
  ) {
    super();
    this.cluster = client.isCluster === true;
    this.commandCtor = options.Command as IoCommandCtor | undefined;
    const so = (client as unknown as { options?: IoSentinelOptions }).options;
    this.sentinel = !this.cluster && so?.sentinels?.length ? ioSentinelView(client, so) : undefined;
    this.pool = new BlockingPool<IoRedisLike>(
      async () => {
        const conn = this.client.duplicate();
        conn.on('error', () => undefined);
        return conn;
      },
      (conn, key, args) => this.send(conn, key, args),
      async (conn) => {
        await conn.quit();
      },
      (conn) => conn.disconnect(),
    );
    this.direct = new OnceConnections<IoRedisLike>(
      (address) => this.openDirect(address),
      (conn, args) => conn.call(String(args[0]), ...args.slice(1)),
      (conn) => conn.disconnect(),
    );
  }

  /**
   * A connection for `once()` (and, under Sentinel, for renewal batches): the client's
   * own settings, at the address of the key's node in a cluster or of the master the
   * Sentinels name, but nothing queued while disconnected, nothing resent after a
   * reconnect, and no reconnect at all.
   */
  private async openDirect(address: string): Promise<IoRedisLike> {
    let conn: IoRedisLike & { connect(): Promise<void> };
    if (this.cluster) {
      const [host, port] = splitAddress(address);
      // A node's duplicate carries the cluster's redisOptions (auth, TLS) to another address.
      const nodes = (this.client as unknown as { nodes(role: string): Array<{ duplicate(o: object): typeof conn }> }).nodes('all');
      if (!nodes[0]) throw new Error('redis-lease: the cluster has no connected node');
      conn = nodes[0].duplicate({ host, port, ...NO_RETRY });
    } else if (this.sentinel) {
      const [host, port] = splitAddress(address);
      conn = (this.client as unknown as { duplicate(o: object): typeof conn }).duplicate({ ...NO_RETRY, sentinels: null, host, port });
    } else {
      conn = (this.client as unknown as { duplicate(o: object): typeof conn }).duplicate(NO_RETRY);
    }
    conn.on('error', () => undefined);
    try {
      await conn.connect();
    } catch (err) {
      conn.disconnect();
      throw err;
    }
    return conn;
  }

  private commandClass(): IoCommandCtor {
    if (this.commandCtor) return this.commandCtor;
    // `Redis.Command` is ioredis's public export; reach it through the client's own copy.
    const fromCtor = (this.client as unknown as { constructor: { Command?: IoCommandCtor } }).constructor.Command;
    const nodes = hasMethod(this.client, 'nodes')
      ? (this.client as unknown as { nodes(role: string): object[] }).nodes('all')
      : [];
    const fromNode = nodes.length
      ? (nodes[0] as { constructor: { Command?: IoCommandCtor } }).constructor.Command
      : undefined;
    let found = fromCtor ?? fromNode;
    if (!found) {
      try {
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        found = (require('ioredis') as { Command?: IoCommandCtor }).Command;
      } catch {
        found = undefined;
      }
    }
    if (!found) throw new Error('redis-lease: cannot find ioredis Command; pass { Command } to the adapter');
    this.commandCtor = found;
    return found;
  }

  private keyed(key: string, args: Arg[]): IoCommand {
    const Command = this.commandClass();
    const cmd = new Command(String(args[0]), args.slice(1), { replyEncoding: 'utf8' });
    cmd.keys = [key];
    return cmd;
  }

  private send(target: IoRedisLike, key: string, args: Arg[]): Promise<unknown> {
    if (!this.cluster) return target.call(String(args[0]), ...args.slice(1));
    const cmd = this.keyed(key, args);
    target.sendCommand(cmd);
    return cmd.promise;
  }

  call(key: string, args: Arg[]): Promise<unknown> {
    return this.send(this.client, key, args);
  }

  async batch(items: BatchItem[]): Promise<BatchResult[]> {
    if (this.sentinel) return this.sentinelBatch(items);
    const results: BatchResult[] = new Array<BatchResult>(items.length);
    // A cluster pipeline must stay on one node: group by the nodes serving each slot.
    const groups = new Map<string, number[]>();
    const slots = this.cluster ? (this.client as unknown as { slots?: string[][] }).slots : undefined;
    items.forEach((item, i) => {
      let g = '';
      if (this.cluster) {
        const slot = keySlot(item.key);
        g = slots?.[slot]?.join(';') ?? `slot:${slot}`;
      }
      let list = groups.get(g);
      if (!list) groups.set(g, (list = []));
      list.push(i);
    });
    await Promise.all(
      [...groups.values()].map(async (idx) => {
        const pipe = this.client.pipeline();
        for (const i of idx) {
          const { key, args } = items[i]!;
          if (this.cluster) pipe.sendCommand(this.keyed(key, args));
          else pipe.call(String(args[0]), ...args.slice(1));
        }
        try {
          const replies = await pipe.exec();
          idx.forEach((i, n) => {
            const r = replies?.[n];
            if (!r) results[i] = { ok: false, error: new Error('redis-lease: pipeline returned no reply') };
            else if (r[0]) results[i] = { ok: false, error: r[0] };
            else results[i] = { ok: true, value: r[1] };
          });
        } catch (error) {
          for (const i of idx) results[i] = { ok: false, error };
        }
      }),
    );
    return results;
  }

  /**
   * Under Sentinel the Sentinels are asked which server is the master before every batch,
   * and the batch goes there on a connection of its own: a demoted master goes on
   * accepting writes until Sentinel reconfigures it, and the client's own connection
   * may still be on it. A READONLY reply drops that connection.
   */
  private async sentinelBatch(items: BatchItem[]): Promise<BatchResult[]> {
    const fail = (error: unknown): BatchResult[] => items.map(() => ({ ok: false, error }));
    const address = await this.sentinel!.master(SENTINEL_BATCH_TIMEOUT_MS);
    if (!address) return fail(new Error('redis-lease: no Sentinel named a master in time'));
    try {
      const replies = await this.direct.with(
        address,
        (conn) => {
          const pipe = conn.pipeline();
          for (const { args } of items) pipe.call(String(args[0]), ...args.slice(1));
          return pipe.exec();
        },
        SENTINEL_BATCH_TIMEOUT_MS,
      );
      const results = items.map((_, n): BatchResult => {
        const r = replies?.[n];
        if (!r) return { ok: false, error: new Error('redis-lease: pipeline returned no reply') };
        return r[0] ? { ok: false, error: r[0] } : { ok: true, value: r[1] };
      });
      if (results.some((r) => !r.ok && isReadonly(r.error))) this.direct.forget(address);
      return results;
    } catch (error) {
      return fail(error);
    }
  }

  async once(key: string, args: Arg[], timeoutMs: number): Promise<unknown> {
    if (this.sentinel) {
      const start = performance.now();
      const address = await this.sentinel.master(timeoutMs);
      if (!address) throw new Unanswered('redis-lease: no Sentinel named a master in time', false);
      return this.direct.run(address, args, timeoutMs - (performance.now() - start));
    }
    let address = '';
    if (this.cluster) {
      address = (this.client as unknown as { slots?: string[][] }).slots?.[keySlot(key)]?.[0] ?? '';
      if (!address) throw new Unanswered(`redis-lease: no node known for ${key}`, false);
    }
    return this.direct.run(address, args, timeoutMs);
  }

  nodeOf(key: string): string {
    if (!this.cluster) return '';
    const slot = keySlot(key);
    return (this.client as unknown as { slots?: string[][] }).slots?.[slot]?.join(';') ?? `slot:${slot}`;
  }

  override async close(): Promise<void> {
    await Promise.all([super.close(), this.sentinel?.close()]);
  }
}

function splitAddress(address: string): [string, number] {
  const i = address.lastIndexOf(':');
  return [address.slice(0, i), Number(address.slice(i + 1))];
}

// ---------------------------------------------------------------- node-redis

/** The parts of a node-redis 4/5 client (`createClient`) this adapter uses. */
export interface NodeRedisClientLike {
  sendCommand(args: Array<string | Buffer>): Promise<unknown>;
  duplicate(): NodeRedisClientLike;
  connect(): Promise<unknown>;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
}

/** The parts of a node-redis 4/5 cluster (`createCluster`) this adapter uses. */
export interface NodeRedisClusterLike {
  sendCommand(firstKey: string, isReadonly: boolean, args: Array<string | Buffer>): Promise<unknown>;
  duplicate(): NodeRedisClusterLike;
  connect(): Promise<unknown>;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
  getMasters(): unknown[];
}

export function isNodeRedis(client: unknown): client is NodeRedisClientLike | NodeRedisClusterLike {
  return hasMethod(client, 'sendCommand') && hasMethod(client, 'connect') && hasMethod(client, 'duplicate');
}

function isNodeRedisCluster(client: unknown): client is NodeRedisClusterLike {
  return hasMethod(client, 'getMasters') && hasMethod(client, 'getSlotMaster');
}

/** A node-redis 4/5 client or cluster. */
export type AnyNodeRedis = NodeRedisClientLike | NodeRedisClusterLike;

async function nodeRedisQuit(conn: AnyNodeRedis): Promise<void> {
  const c = conn as unknown as Record<string, () => Promise<unknown> | void>;
  // node-redis 5 calls it close(); 4 calls it quit().
  if (typeof c.close === 'function') await c.close();
  else if (typeof c.quit === 'function') await c.quit();
}

/** `conn` connected, its errors left to the caller's promises; closed again if it cannot connect. */
async function connected(conn: NodeRedisClientLike): Promise<NodeRedisClientLike> {
  conn.on('error', () => undefined);
  try {
    await conn.connect();
  } catch (err) {
    nodeRedisKill(conn);
    throw err;
  }
  return conn;
}

function nodeRedisKill(conn: AnyNodeRedis): void {
  const c = conn as unknown as Record<string, () => Promise<unknown> | void>;
  try {
    const r = typeof c.destroy === 'function' ? c.destroy() : c.disconnect?.();
    if (r && typeof (r as Promise<unknown>).catch === 'function') (r as Promise<unknown>).catch(() => undefined);
  } catch {
    // already closed
  }
}

/**
 * node-redis pipelines every command issued in the same tick into one write, so a batch
 * is the commands sent together.
 */
export class NodeRedisAdapter extends OwnConnections<AnyNodeRedis, NodeRedisClientLike> implements LeaseAdapter {
  private readonly cluster: boolean;
  /** @internal */
  protected readonly pool: BlockingPool<AnyNodeRedis>;
  /** @internal */
  protected readonly direct: OnceConnections<NodeRedisClientLike>;

  constructor(private readonly client: AnyNodeRedis) {
    super();
    this.cluster = isNodeRedisCluster(client);
    this.pool = new BlockingPool<AnyNodeRedis>(
      async () => {
        const conn = this.client.duplicate();
        conn.on('error', () => undefined);
        await conn.connect();
        return conn;
      },
      (conn, key, args) => this.send(conn, key, args),
      nodeRedisQuit,
      nodeRedisKill,
    );
    this.direct = new OnceConnections<NodeRedisClientLike>(
      (address) => this.openDirect(address),
      (conn, args) => conn.sendCommand(args.map((a) => (typeof a === 'number' ? String(a) : a))),
      nodeRedisKill,
    );
  }

  /**
   * A connection for `once()`: a duplicate of the client (in a cluster: of the client
   * of the node serving the key) that rejects commands while disconnected instead of
   * queueing them and never reconnects.
   */
  private async openDirect(address: string): Promise<NodeRedisClientLike> {
    let base: NodeRedisClientLike;
    if (this.cluster) {
      const cluster = this.client as NodeRedisClusterLike & { nodeClient(node: unknown): unknown };
      const master = cluster.getMasters().find((m) => nodeAddress(m) === address);
      if (!master) throw new Error(`redis-lease: no master at ${address}`);
      base = (await cluster.nodeClient(master)) as NodeRedisClientLike;
    } else {
      base = this.client as NodeRedisClientLike;
    }
    const socket = (base as unknown as { options?: { socket?: object } }).options?.socket ?? {};
    return connected(
      (base as unknown as { duplicate(o: object): NodeRedisClientLike }).duplicate({
        disableOfflineQueue: true,
        socket: { ...socket, reconnectStrategy: false },
      }),
    );
  }

  once(key: string, args: Arg[], timeoutMs: number): Promise<unknown> {
    let address = '';
    if (this.cluster) {
      const cluster = this.client as NodeRedisClusterLike & { getSlotMaster(slot: number): unknown };
      address = nodeAddress(cluster.getSlotMaster(keySlot(key)));
      if (!address) return Promise.reject(new Unanswered(`redis-lease: no node known for ${key}`, false));
    }
    return this.direct.run(address, args, timeoutMs);
  }

  private send(target: AnyNodeRedis, key: string, args: Arg[]): Promise<unknown> {
    const strArgs = args.map((a) => (typeof a === 'number' ? String(a) : a));
    if (this.cluster) return (target as NodeRedisClusterLike).sendCommand(key, false, strArgs);
    return (target as NodeRedisClientLike).sendCommand(strArgs);
  }

  call(key: string, args: Arg[]): Promise<unknown> {
    return this.send(this.client, key, args);
  }

  async batch(items: BatchItem[]): Promise<BatchResult[]> {
    const settled = await Promise.allSettled(items.map((it) => this.send(this.client, it.key, it.args)));
    return settled.map((s) => (s.status === 'fulfilled' ? { ok: true, value: s.value } : { ok: false, error: s.reason }));
  }

  nodeOf(key: string): string {
    if (!this.cluster) return '';
    return nodeAddress((this.client as unknown as { getSlotMaster(slot: number): unknown }).getSlotMaster(keySlot(key)));
  }

}

/** The parts of a node-redis 5 Sentinel client (`createSentinel`) this adapter uses. */
export interface NodeRedisSentinelLike {
  sendCommand(isReadonly: boolean | undefined, args: Array<string | Buffer>): Promise<unknown>;
  getMasterNode(): { host: string; port: number } | undefined;
  getSentinelNode(): { host: string; port: number } | undefined;
  on(event: string, listener: (...args: unknown[]) => void): unknown;
}

/** node-redis's `createClient`, or a wrapper of it that adds the options a server needs (auth, TLS). */
export type CreateClient = (options: {
  socket: { host: string; port: number; reconnectStrategy?: false };
  disableOfflineQueue?: boolean;
}) => unknown;

export function isNodeRedisSentinel(client: unknown): client is NodeRedisSentinelLike {
  return hasMethod(client, 'getMasterNode') && hasMethod(client, 'sendCommand') && hasMethod(client, 'getReplicaNodes');
}

/**
 * node-redis 5 Sentinel (`createSentinel`). Its commands go to the master the Sentinels
 * name; it cannot open a plain connection of its own, so connections for blocking
 * acquires and fenced writes come from `createClient` at the master's current address.
 */
export class NodeRedisSentinelAdapter extends OwnConnections<NodeRedisClientLike, NodeRedisClientLike> implements LeaseAdapter {
  /** @internal */
  protected readonly pool: BlockingPool<NodeRedisClientLike>;
  /** @internal */
  protected readonly direct: OnceConnections<NodeRedisClientLike>;

  /** With `sentinelName`: the Sentinels, asked before every renewal batch and fenced write. */
  private readonly sentinel: SentinelView | undefined;

  constructor(
    private readonly client: NodeRedisSentinelLike,
    private readonly createClient: CreateClient | undefined,
    sentinelName?: string,
  ) {
    super();
    if (createClient && sentinelName) {
      // node-redis names the Sentinel it follows; its other Sentinels are not public.
      const sentinels = new OnceConnections<NodeRedisClientLike>(
        (address) => this.connect(splitAddress(address), true),
        (conn, args) => conn.sendCommand(strings(args)),
        nodeRedisKill,
      );
      const addresses = (): string[] => {
        const n = this.client.getSentinelNode();
        return n ? [`${n.host}:${n.port}`] : [];
      };
      this.sentinel = new SentinelView(addresses, sentinelName, sentinels as OnceConnections<unknown>);
    }
    this.pool = new BlockingPool<NodeRedisClientLike>(
      () => this.open(false),
      (conn, _key, args) => conn.sendCommand(strings(args)),
      nodeRedisQuit,
      nodeRedisKill,
    );
    this.direct = new OnceConnections<NodeRedisClientLike>(
      (address) => this.open(true, address),
      (conn, args) => conn.sendCommand(strings(args)),
      nodeRedisKill,
    );
  }

  private async open(once: boolean, address?: string): Promise<NodeRedisClientLike> {
    const master = address ? splitAddress(address) : this.client.getMasterNode();
    if (!master) throw new Error('redis-lease: the Sentinels name no master yet');
    return this.connect(Array.isArray(master) ? master : [master.host, master.port], once);
  }

  private async connect([host, port]: [string, number], once: boolean): Promise<NodeRedisClientLike> {
    if (!this.createClient) {
      throw new TypeError('redis-lease: a node-redis Sentinel needs new Leases(sentinel, { createClient }) for blocking acquires and fenced writes');
    }
    const socket = once ? { host, port, reconnectStrategy: false as const } : { host, port };
    return connected(this.createClient(once ? { socket, disableOfflineQueue: true } : { socket }) as NodeRedisClientLike);
  }

  call(_key: string, args: Arg[]): Promise<unknown> {
    return this.client.sendCommand(false, strings(args));
  }

  /**
   * With `sentinelName`, as for ioredis: the Sentinel is asked which server is the master
   * before every batch and the batch goes there on a connection of its own (node-redis
   * may go on writing to a demoted master until the Sentinels reconfigure it, ~10 s).
   */
  async batch(items: BatchItem[]): Promise<BatchResult[]> {
    const address = this.sentinel ? await this.sentinel.master(SENTINEL_BATCH_TIMEOUT_MS) : undefined;
    let settled: Array<PromiseSettledResult<unknown>>;
    if (address) {
      try {
        settled = await this.direct.with(
          address,
          (conn) => Promise.allSettled(items.map((it) => conn.sendCommand(strings(it.args)))),
          SENTINEL_BATCH_TIMEOUT_MS,
        );
      } catch (error) {
        return items.map(() => ({ ok: false, error }));
      }
      if (settled.some((r) => r.status === 'rejected' && isReadonly(r.reason))) this.direct.forget(address);
    } else {
      settled = await Promise.allSettled(items.map((it) => this.call(it.key, it.args)));
    }
    return settled.map((s) => (s.status === 'fulfilled' ? { ok: true, value: s.value } : { ok: false, error: s.reason }));
  }

  async once(_key: string, args: Arg[], timeoutMs: number): Promise<unknown> {
    // Keyed by the master's address: a failover opens a new connection.
    const start = performance.now();
    let address = this.sentinel ? await this.sentinel.master(timeoutMs) : undefined;
    if (!address) {
      const m = this.client.getMasterNode();
      address = m ? `${m.host}:${m.port}` : '';
    }
    if (!address) throw new Unanswered('redis-lease: no master known', false);
    return this.direct.run(address, args, timeoutMs - (performance.now() - start));
  }

  override async close(): Promise<void> {
    await Promise.all([super.close(), this.sentinel?.close()]);
  }

  nodeOf(): string {
    return '';
  }

}

function strings(args: Arg[]): Array<string | Buffer> {
  return args.map((a) => (typeof a === 'number' ? String(a) : a));
}

function nodeAddress(node: unknown): string {
  const n = node as { host?: string; port?: number } | undefined;
  return n?.host && n.port ? `${n.host}:${n.port}` : '';
}

function isAdapter(obj: unknown): obj is LeaseAdapter {
  return ['call', 'batch', 'blocking', 'once', 'isReplyError', 'close'].every((m) => hasMethod(obj, m));
}

/** The adapter for a client: ioredis, node-redis, or an adapter given as is. */
export function adapterFor(client: unknown, options: { createClient?: CreateClient; sentinelName?: string } = {}): LeaseAdapter {
  if (isAdapter(client)) return client;
  if (isNodeRedisSentinel(client)) return new NodeRedisSentinelAdapter(client, options.createClient, options.sentinelName);
  if (isIoRedis(client)) return new IoRedisAdapter(client);
  if (isNodeRedis(client)) return new NodeRedisAdapter(client);
  throw new TypeError('redis-lease: expected an ioredis or node-redis client, or a LeaseAdapter');
}
