import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';

import { adapterFor, type Arg, type BatchItem, type BatchResult, type CreateClient, type LeaseAdapter, Unanswered } from './adapter';
import { LeaseLost, NotAcquired, NotConfirmed, staleFenceFrom, WriteIndeterminate } from './errors';
import { type HoldOptions, Mutex, ReadWriteLock, Semaphore } from './types';

/**
 * - `held`: the last renewal was confirmed and its deadline has not passed.
 * - `suspended`: the server could not be reached (connection error, or no reply within
 *   ttl/3); the lease may still be held, up to the deadline last confirmed.
 * - `lost`: a renewal was refused, the deadline passed unconfirmed, the session ended,
 *   or a fenced write was stale. Final: a lost lease never comes back.
 * - `released`: `release()` (or `close()`) gave it up. Final.
 */
export type LeaseState = 'held' | 'suspended' | 'lost' | 'released';

export interface AcquireOptions {
  /** Lease time in ms (1 to 2^40). Default: the Leases' `ttlMs` (30 s); 0 with `session` (the default there). */
  ttlMs?: number;
  /** Wait up to this long for the key (`BLOCK`); 0 waits forever. Default: do not wait. */
  blockMs?: number;
  /** The holder's token. Default: 128 random bits as 32 hex digits. */
  token?: string;
  /** A shared hold (`SHARED`): readers of a read/write lease, or the permits of a semaphore. */
  shared?: boolean;
  /** With `shared`: at most this many holders (`LIMIT`), a semaphore. */
  limit?: number;
  /** Bind the hold to this session (`SESSION`): it lives while the session does. */
  session?: Session;
  /** A label for the holder (`OWNER`), shown by LEASE.INFO and LEASE.HOLDERS. */
  owner?: string;
  /** Lock-delay (`DELAY`): after this hold expires, nobody gets the key for this long. */
  delayMs?: number;
  /** Stop renewing once the lease has been held this long (it then expires and is lost). */
  maxHoldMs?: number;
  /** Stop renewing after this many renewals (it then expires and is lost). */
  maxRenewals?: number;
  /** Renew in the watchdog (default true). Without, the lease is lost at its deadline unless `renew()`ed. */
  autoRenew?: boolean;
  /** Abort a blocking wait (`blockMs`). */
  signal?: AbortSignal;
  /** Confirm the grant and every renewal by replicas (overrides the Leases' `confirm`); `null` for none. */
  confirm?: ConfirmOptions | null;
}

/**
 * Confirmed grants: `WAIT replicas timeoutMs` (or `WAITAOF 1 replicas timeoutMs` with
 * `aof`) is sent in the same round trip as the `LEASE.ACQUIRE` and as every renewal, on
 * the same connection, right behind it. A grant confirmed by fewer replicas is released
 * and rejected (NotConfirmed); a renewal confirmed by fewer is a loss. A WAIT sent after
 * the reply could confirm a grant already lost and handed on; in the same round trip it
 * confirms only what this connection wrote.
 */
export interface ConfirmOptions {
  /** How many replicas must acknowledge. */
  replicas: number;
  /** How long the server waits for them, ms. Keep it well under the ttl. Default 100. */
  timeoutMs?: number;
  /**
   * `WAITAOF`: also wait for the master's own AOF fsync (the master needs
   * `appendonly yes`; replicas count only once they fsynced). Redis 7.2+ and Valkey 8+;
   * Redis 7.0 has no WAITAOF and the acquire rejects with the server's error.
   */
  aof?: boolean;
}

export interface LeasesOptions {
  /** Confirm every grant and renewal by replicas (see ConfirmOptions). Default none. */
  confirm?: ConfirmOptions;
  /**
   * node-redis 5 Sentinel only: node-redis's `createClient` (or a wrapper adding auth or
   * TLS options), for the connections of blocking acquires and fenced writes, opened at
   * the address of the master the Sentinels name.
   */
  createClient?: CreateClient;
  /**
   * node-redis 5 Sentinel: the master's name, as given to `createSentinel`. With it (and
   * `createClient`) the watchdog asks the Sentinel which server is the master before
   * every renewal batch, as it does for ioredis; without it, it renews through the
   * Sentinel client, which may write to a demoted master for a few seconds.
   */
  sentinelName?: string;
  /** Default lease time, ms. Default 30 000. */
  ttlMs?: number;
  /** Default cap on total hold time for every lease, ms. Default none. */
  maxHoldMs?: number;
  /** Default cap on renewals for every lease. Default none. */
  maxRenewals?: number;
}

export interface SessionOptions {
  /** The session's key. Default `lease:session:<random>`; in a cluster use a hash tag shared with its leases. */
  key?: string;
  owner?: string;
  token?: string;
}

/** Counters of the watchdog's work, for tests and metrics. */
export interface WatchdogStats {
  /** Batches of renewals sent (each one pipelined write per node). */
  renewalBatches: number;
  /** LEASE.RENEW commands sent by the watchdog. */
  renewalsSent: number;
}

const now = (): number => performance.now();
const DEFAULT_CONFIRM_MS = 100;

function checkConfirm(c: ConfirmOptions): void {
  if (!Number.isInteger(c.replicas) || c.replicas < 1) throw new RangeError(`redis-lease: confirm.replicas must be a positive integer, got ${c.replicas}`);
  checkMs('confirm.timeoutMs', c.timeoutMs, 1);
}

function waitArgs(c: ConfirmOptions): Arg[] {
  const timeout = c.timeoutMs ?? DEFAULT_CONFIRM_MS;
  return c.aof ? ['WAITAOF', 1, c.replicas, timeout] : ['WAIT', c.replicas, timeout];
}

function waitReply(c: ConfirmOptions, reply: unknown): { replicas: number; aofLocal?: number } {
  if (c.aof) {
    const r = Array.isArray(reply) ? reply : [];
    return { aofLocal: Number(r[0] ?? 0), replicas: Number(r[1] ?? 0) };
  }
  return { replicas: Number(reply) };
}

function confirmedEnough(c: ConfirmOptions, got: { replicas?: number; aofLocal?: number } | undefined): boolean {
  if (!got || (got.replicas ?? 0) < c.replicas) return false;
  return !c.aof || (got.aofLocal ?? 0) >= 1;
}
const MAX_TTL = 2 ** 40;

function checkMs(name: string, v: number | undefined, min: number): void {
  if (v === undefined) return;
  if (!Number.isInteger(v) || v < min || v > MAX_TTL) {
    throw new RangeError(`redis-lease: ${name} must be an integer from ${min} to ${MAX_TTL} (ms), got ${v}`);
  }
}

/** A held lease: its token, its fence, its state and the signal that fires when it is lost. */
export class Lease {
  readonly key: string;
  /** The holder's token: the capability to renew and release. */
  readonly token: string;
  /** The fencing token of this grant: higher than every fence issued before for the key. */
  readonly fence: number;
  /** The ttl renewals ask for (0 for a hold that lives as long as its session). */
  readonly ttlMs: number;
  readonly shared: boolean;
  readonly owner: string | undefined;
  /** The session this hold is bound to. */
  readonly session: Session | undefined;

  /** @internal */ readonly _leases: Leases;
  /** @internal */ _state: LeaseState = 'held';
  /** @internal */ readonly _abort = new AbortController();
  /** @internal monotonic ms: the server's deadline is no earlier than this */
  _confirmedUntil: number;
  /** @internal */ _nextRenewAt: number;
  /** @internal monotonic ms the renewal in flight was sent, or -1 */
  _inflightSince = -1;
  /** @internal */ readonly _acquiredAt: number;
  /** @internal */ _renewals = 0;
  /** @internal */ readonly _maxHoldMs: number | undefined;
  /** @internal */ readonly _maxRenewals: number | undefined;
  /** @internal */ readonly _autoRenew: boolean;
  /** @internal */ _releasing = false;
  /** @internal the release was answered 0: the lease had been lost before */
  _foundGone = false;
  /** @internal */ readonly _confirm: ConfirmOptions | undefined;
  /** @internal */ _replicas: number | undefined;
  /** @internal */ _aofLocal: number | undefined;

  /** Replicas that acknowledged the grant or the last confirmed renewal (undefined without `confirm`). */
  get replicas(): number | undefined {
    return this._replicas;
  }

  /** With `confirm.aof`: 1 when the master had fsynced the grant or last renewal to its AOF. */
  get aofLocal(): number | undefined {
    return this._aofLocal;
  }

  /** @internal */
  constructor(
    leases: Leases,
    key: string,
    token: string,
    fence: number,
    ttlMs: number,
    sentAt: number,
    opts: AcquireOptions,
  ) {
    this._leases = leases;
    this.key = key;
    this.token = token;
    this.fence = fence;
    this.ttlMs = ttlMs;
    this.shared = opts.shared === true;
    this.owner = opts.owner;
    this.session = opts.session;
    this._acquiredAt = sentAt;
    this._confirmedUntil = sentAt + ttlMs;
    this._nextRenewAt = sentAt + ttlMs / 3;
    this._maxHoldMs = opts.maxHoldMs ?? leases._options.maxHoldMs;
    this._maxRenewals = opts.maxRenewals ?? leases._options.maxRenewals;
    this._autoRenew = opts.autoRenew !== false;
    this._confirm = opts.confirm === null ? undefined : (opts.confirm ?? leases._options.confirm);
  }

  /** held, suspended, lost or released; a deadline that passed unconfirmed reads as lost at once. */
  get state(): LeaseState {
    this._refresh();
    return this._state;
  }

  /** Aborts when the lease is lost; its `reason` is a LeaseLost. Never aborts on release. */
  get signal(): AbortSignal {
    this._refresh();
    return this._abort.signal;
  }

  /** The local monotonic deadline (performance.now() ms) before which the server still holds the lease. */
  get deadline(): number {
    if (!this.session) return this._confirmedUntil;
    return this._bound ? this.session.deadline : Math.min(this._confirmedUntil, this.session.deadline);
  }

  /**
   * `await using lease = await leases.acquire(key)`: released when the block exits
   * (explicit resource management; TypeScript 5.2+, or Node with the syntax). Unlike
   * `leases.using()`, a loss during the block is not raised here: check `lease.signal`.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  /** Throws the LeaseLost if the lease is lost, and an Error if it was released. */
  check(): void {
    const state = this.state;
    if (state === 'lost') throw this._abort.signal.reason;
    if (state === 'released') throw new Error(`redis-lease: lease on ${this.key} was released`);
  }

  /** @internal a hold without a deadline of its own: only its session is renewed */
  get _bound(): boolean {
    return this.session !== undefined && this.ttlMs === 0;
  }

  /** @internal */
  _refresh(): void {
    if (this._state !== 'held' && this._state !== 'suspended') return;
    if (this.session) {
      this.session._refresh();
      if (this.session._state === 'lost' || this.session._state === 'released') {
        this._leases._lose(this, `its session ${this.session.key} ended (${this.session._state})`);
        return;
      }
    }
    if (!this._bound && now() >= this._confirmedUntil) {
      this._leases._lose(this, 'its deadline passed without a confirmed renewal');
    }
  }

  /** Renew now (the watchdog does this by itself). Throws LeaseLost if the lease is gone. */
  async renew(ttlMs: number = this.ttlMs): Promise<void> {
    checkMs('ttlMs', ttlMs, this.session ? 0 : 1);
    this.check();
    const sentAt = now();
    const [r] = await this._leases._batch([{ key: this.key, args: ['LEASE.RENEW', this.key, this.token, ttlMs] }], this._confirm);
    if (!r!.ok) throw r!.error;
    this._leases._renewed(this, sentAt, ttlMs, r!);
    this.check();
  }

  /**
   * Release the lease. Resolves true if the server released it; false if it was already
   * lost or released, or if the server answered that it was no longer held (the lease
   * is then lost, and its signal fires). While the server cannot be reached it waits at
   * most until the lease's confirmed deadline (then false: lost, freed by its expiry).
   * A connection error rejects, and the lease counts as released (no longer renewed).
   */
  async release(): Promise<boolean> {
    this._refresh();
    if (this._state === 'released') return false;
    const reply = this._leases._adapter.call(this.key, ['LEASE.RELEASE', this.key, this.token]);
    if (this._state === 'lost') {
      // A courtesy to the server (the lease may not have expired there yet); nothing to wait for.
      reply.catch(() => undefined);
      return false;
    }
    // No more renewals; the watchdog still watches the deadline, which ends the wait.
    this._releasing = true;
    const lost = new Promise<'lost'>((res) => {
      if (this._abort.signal.aborted) res('lost');
      else this._abort.signal.addEventListener('abort', () => res('lost'), { once: true });
    });
    let answer: unknown;
    try {
      answer = await Promise.race([reply, lost]);
    } catch (err) {
      this._leases._setState(this, 'released');
      if (this instanceof Session) this._leases._endSession(this, 'released');
      throw err;
    }
    if (answer === 'lost') {
      reply.catch(() => undefined);
      return false;
    }
    if (Number(answer) === 1) {
      this._leases._setState(this, 'released');
      if (this instanceof Session) this._leases._endSession(this, 'released');
      return true;
    }
    this._foundGone = true;
    this._leases._lose(this, 'it was no longer held when released');
    return false;
  }

  /**
   * `LEASE.FENCE resource fence ...args`: runs the command only if this lease's fence is
   * not older than the resource's highest, in one atomic step. Returns its reply.
   *
   * The write is sent once, on a connection of the adapter's own that neither queues
   * nor resends, and its reply awaited no longer than the lease's time left. Throws
   * StaleFence (and the lease is lost) when a newer holder has written; LeaseLost,
   * sending nothing, when the lease is already lost; WriteIndeterminate when it was sent
   * and no reply came in time or the connection failed after sending: it may have run,
   * and may still run on the server it reached, but it is never sent again, and the
   * lease is `suspended` (then `lost` at its deadline) until a renewal confirms it. A
   * failure before anything was sent rejects with that error (the write did not run).
   */
  async fenceCall(resource: string, ...args: Arg[]): Promise<unknown> {
    return this.fenceCallWith(resource, args);
  }

  /**
   * `fenceCall` with options. `retries`: how many more times to send the write after an
   * unanswered attempt, while the lease is held or suspended and within its deadline,
   * each on a new connection. Only for a command that is safe to run twice: a retry
   * after an unanswered attempt can make it run twice.
   */
  async fenceCallWith(resource: string, args: Arg[], options: { retries?: number } = {}): Promise<unknown> {
    this.check();
    let retries = options.retries ?? 0;
    let attempts = 0;
    let cause: unknown;
    for (;;) {
      this._refresh();
      const left = this.deadline - now();
      if ((this._state !== 'held' && this._state !== 'suspended') || left <= 0) {
        this._refresh();
        if (attempts > 0) throw new WriteIndeterminate(this.key, resource, this.fence, attempts, { cause });
        this.check();
        throw this._abort.signal.reason ?? new Error(`redis-lease: lease on ${this.key} is not held`);
      }
      try {
        return await this._leases._adapter.once(resource, ['LEASE.FENCE', resource, this.fence, ...args], Math.ceil(left) + 1);
      } catch (err) {
        if (!(err instanceof Unanswered)) {
          const stale = this._leases._adapter.isReplyError(err) ? staleFenceFrom(resource, err) : undefined;
          if (!stale) throw err;
          this._leases._lose(this, `a write to ${resource} was refused as stale`, stale);
          throw stale;
        }
        this._leases._writeFailed(this);
        if (err.sent) {
          attempts++;
          cause = err;
        }
        if (retries <= 0) {
          this._refresh();
          if (attempts > 0) throw new WriteIndeterminate(this.key, resource, this.fence, attempts, { cause });
          if (this.state === 'lost') throw new LeaseLost(this.key, this.fence, 'lost while a fenced write was refused', { cause: err });
          throw err.cause ?? err;
        }
        retries--;
        // As the watchdog after a failed renewal: soon, but not in a tight loop.
        await new Promise((r) => setTimeout(r, Math.max(5, Math.min(this.ttlMs / 10 || 250, 250))));
      }
    }
  }
}

/**
 * A session: an exclusive lease whose renewal keeps every hold bound to it alive. The
 * watchdog renews the session, not the holds bound with ttl 0.
 */
export class Session extends Lease {
  /** @internal */ readonly _holds = new Set<Lease>();

  /** Holds currently bound to this session through this Leases object. */
  get holds(): number {
    return this._holds.size;
  }
}

/** Scoped body of `using()`. */
export type LeaseBody<T> = (lease: Lease, signal: AbortSignal) => Promise<T> | T;

/**
 * Leases over one Redis client, with one watchdog (a single timer) that renews every
 * lease it holds at ttl/3, the renewals due together pipelined in one batch.
 */
export class Leases {
  /** @internal */ readonly _adapter: LeaseAdapter;
  /** @internal */ readonly _options: Required<Pick<LeasesOptions, 'ttlMs'>> & LeasesOptions;
  private readonly watched = new Set<Lease>();
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Infinity;
  private ticking = false;
  private closed = false;
  private readonly closing = new AbortController();
  private readonly all = new Set<Lease>();
  private readonly counters: WatchdogStats = { renewalBatches: 0, renewalsSent: 0 };

  /**
   * `client`: an ioredis `Redis` (standalone or Sentinel) or `Cluster`, a node-redis
   * client, cluster or (5) Sentinel, or a LeaseAdapter. The watchdog renews through it,
   * so it follows the same topology: the master the Sentinels name, the node serving
   * each key's slot.
   */
  constructor(client: unknown, options: LeasesOptions = {}) {
    this._adapter = adapterFor(client, { createClient: options.createClient, sentinelName: options.sentinelName });
    checkMs('ttlMs', options.ttlMs, 1);
    this._options = { ...options, ttlMs: options.ttlMs ?? 30_000 };
  }

  get stats(): Readonly<WatchdogStats> {
    return { ...this.counters };
  }

  /** @internal renewal batches sent and not yet answered */
  _inflight = 0;

  /** Leases not yet lost or released. */
  get active(): number {
    return this.all.size;
  }

  /** Acquire `key`. Throws NotAcquired when the server answers nil (also after `blockMs`). */
  async acquire(key: string, opts: AcquireOptions = {}): Promise<Lease> {
    return this.grant(key, opts, false) as Promise<Lease>;
  }

  /** A session: an exclusive lease on `opts.key` to bind holds to with `acquire(key, { session })`. */
  async session(ttlMs: number, opts: SessionOptions = {}): Promise<Session> {
    checkMs('ttlMs', ttlMs, 1);
    const key = opts.key ?? `lease:session:${randomBytes(8).toString('hex')}`;
    return this.grant(key, { ttlMs, owner: opts.owner, token: opts.token }, true) as Promise<Session>;
  }

  /**
   * Acquire, run `body(lease, signal)`, release. Throws NotAcquired (the body does not
   * run), the body's error, or LeaseLost if the lease was lost while the body ran
   * (noticed or not; a StaleFence counts as lost), with the body's error as its cause.
   */
  async using<T>(key: string, opts: AcquireOptions, body: LeaseBody<T>): Promise<T>;
  async using<T>(key: string, body: LeaseBody<T>): Promise<T>;
  async using<T>(key: string, a: AcquireOptions | LeaseBody<T>, b?: LeaseBody<T>): Promise<T> {
    const opts = typeof a === 'function' ? {} : a;
    const body = typeof a === 'function' ? a : b;
    if (!body) throw new TypeError('redis-lease: using() needs a body');
    const lease = await this.acquire(key, opts);
    let result: T | undefined;
    let failed = false;
    let bodyError: unknown;
    try {
      result = await body(lease, lease.signal);
    } catch (err) {
      failed = true;
      bodyError = err;
    }
    // Lost while the body ran: seen by now, or found by the release below. A deadline
    // that passes while the release waits for an unreachable server came after the body.
    const lostInBody = lease.state === 'lost';
    let releaseError: unknown;
    let releaseFailed = false;
    try {
      await lease.release();
    } catch (err) {
      releaseFailed = true;
      releaseError = err;
    }
    if (lostInBody || lease._foundGone) {
      const lost = lease._abort.signal.reason as LeaseLost;
      if (!failed || bodyError === lost) throw lost;
      throw new LeaseLost(lease.key, lease.fence, lost.why, { cause: bodyError });
    }
    if (failed) throw bodyError;
    if (releaseFailed) throw releaseError;
    return result as T;
  }

  /** An exclusive lock on `key`: `acquire()`, `runExclusive(fn)`. */
  mutex(key: string, defaults: HoldOptions = {}): Mutex {
    return new Mutex(this, key, defaults);
  }

  /** A read/write lock on `key`: `read()`, `write()`, `runRead(fn)`, `runWrite(fn)`. */
  readWriteLock(key: string, defaults: HoldOptions = {}): ReadWriteLock {
    return new ReadWriteLock(this, key, defaults);
  }

  /** A semaphore of `permits` on `key`: `acquire()`, `runExclusive(fn)`. */
  semaphore(key: string, permits: number, defaults: HoldOptions = {}): Semaphore {
    return new Semaphore(this, key, permits, defaults);
  }

  /** `using(key, opts, fn)` under the name async-mutex users know. */
  runExclusive<T>(key: string, fn: LeaseBody<T>, opts: AcquireOptions = {}): Promise<T> {
    return this.using(key, opts, fn);
  }

  /**
   * Stop the watchdog, release every lease still held (pipelined; holds bound to a
   * session before the session), and close the connections opened for blocking waits.
   * Waits at most `timeoutMs` (5 s) for the releases' replies. Leaves no timer behind.
   * The client given to the constructor stays open.
   */
  async close(options: { timeoutMs?: number } = {}): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.closing.abort(new Error('redis-lease: Leases closed'));
    this.clearTimer();
    // An unreachable server must not hold close() up: past the timeout the leases are
    // given up unanswered (the server frees them at their deadlines).
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<void>((res) => {
      timer = setTimeout(res, options.timeoutMs ?? 5000);
    });
    try {
      await Promise.race([this.releaseAll(), timedOut]);
    } finally {
      clearTimeout(timer);
    }
    const unanswered = [...this.all];
    for (const l of unanswered) if (!(l instanceof Session)) this._setState(l, 'released');
    for (const l of unanswered) this._setState(l, 'released');
    await this._adapter.close();
  }

  private async releaseAll(): Promise<void> {
    const live = [...this.all];
    const first = live.filter((l) => !(l instanceof Session));
    const second = live.filter((l) => l instanceof Session);
    for (const group of [first, second]) {
      if (!group.length) continue;
      for (const l of group) {
        l._releasing = true;
        this._unwatch(l);
      }
      const results = await this._adapter.batch(
        group.map((l) => ({ key: l.key, args: ['LEASE.RELEASE', l.key, l.token] })),
      );
      group.forEach((l, i) => {
        const r = results[i]!;
        if (l._state !== 'held' && l._state !== 'suspended') return;
        if (r.ok && Number(r.value) === 0) this._lose(l, 'it was no longer held when released');
        else this._setState(l, 'released');
        if (l instanceof Session) this._endSession(l, 'released');
      });
    }
  }

  /**
   * @internal Sends `items` as one batch; with `confirm`, a WAIT (or WAITAOF) right behind
   * each server's commands, in the same round trip. Each result carries the replicas (and
   * AOF) that server's WAIT confirmed, or the WAIT's error as the result's error.
   */
  async _batch(items: BatchItem[], confirm: ConfirmOptions | undefined): Promise<Array<BatchResult & { replicas?: number; aofLocal?: number }>> {
    if (!confirm) return this._adapter.batch(items);
    const groups = new Map<string, number[]>();
    items.forEach((it, i) => {
      const g = this._adapter.nodeOf ? this._adapter.nodeOf(it.key) : '';
      let list = groups.get(g);
      if (!list) groups.set(g, (list = []));
      list.push(i);
    });
    const sent: BatchItem[] = [];
    const waitAt = new Map<number, number>();
    for (const idx of groups.values()) {
      const at = sent.length + idx.length;
      for (const i of idx) {
        waitAt.set(i, at);
        sent.push(items[i]!);
      }
      sent.push({ key: items[idx[0]!]!.key, args: waitArgs(confirm) });
    }
    const order = [...groups.values()].flat();
    const results = await this._adapter.batch(sent);
    const out = new Array<BatchResult & { replicas?: number; aofLocal?: number }>(items.length);
    let n = 0;
    for (const i of order) {
      // Positions in `sent`: each group's items in order, then its WAIT.
      while (sent[n] !== items[i]) n++;
      const r = results[n]!;
      const w = results[waitAt.get(i)!]!;
      if (!r.ok || !w.ok) out[i] = r.ok ? { ok: false, error: w.ok ? undefined : w.error } : r;
      else out[i] = { ...r, ...waitReply(confirm, w.value) };
      n++;
    }
    return out;
  }

  // ------------------------------------------------------------------ acquire

  private async grant(key: string, opts: AcquireOptions, isSession: boolean): Promise<Lease> {
    if (this.closed) throw new Error('redis-lease: Leases closed');
    const session = opts.session;
    if (session && session._leases !== this) throw new Error('redis-lease: the session belongs to another Leases');
    const ttlMs = opts.ttlMs ?? (session ? 0 : this._options.ttlMs);
    checkMs('ttlMs', ttlMs, session ? 0 : 1);
    checkMs('blockMs', opts.blockMs, 0);
    checkMs('delayMs', opts.delayMs, 0);
    if (session) session.check();
    const token = opts.token ?? randomBytes(16).toString('hex');
    const args: Arg[] = ['LEASE.ACQUIRE', key, ttlMs, 'TOKEN', token];
    if (opts.shared) {
      args.push('SHARED');
      if (opts.limit !== undefined) args.push('LIMIT', opts.limit);
    } else if (opts.limit !== undefined) {
      throw new TypeError('redis-lease: limit needs shared: true');
    }
    if (session) args.push('SESSION', session.key, session.token);
    if (opts.owner !== undefined) args.push('OWNER', opts.owner);
    if (opts.delayMs !== undefined) args.push('DELAY', opts.delayMs);

    const confirm = opts.confirm === null ? undefined : (opts.confirm ?? this._options.confirm);
    if (confirm) checkConfirm(confirm);
    let sentAt = now();
    let reply: unknown;
    let confirmed: { replicas?: number; aofLocal?: number } | undefined;
    if (opts.blockMs !== undefined) {
      const signal = opts.signal ? AbortSignal.any([opts.signal, this.closing.signal]) : this.closing.signal;
      const blockArgs = [...args, 'BLOCK', opts.blockMs];
      if (confirm) {
        if (!this._adapter.blockingThen) throw new TypeError('redis-lease: this adapter cannot confirm a blocking acquire (no blockingThen)');
        const [r, w] = await this._adapter.blockingThen(key, blockArgs, waitArgs(confirm), signal);
        reply = r;
        confirmed = waitReply(confirm, w);
      } else {
        reply = await this._adapter.blocking(key, blockArgs, signal);
      }
    } else {
      const once = async (): Promise<unknown> => {
        if (!confirm) return this._adapter.call(key, args);
        const [r] = await this._batch([{ key, args }], confirm);
        if (!r!.ok) throw r!.error;
        confirmed = { replicas: r!.replicas, aofLocal: r!.aofLocal };
        return r!.value;
      };
      try {
        reply = await once();
      } catch (err) {
        if (this._adapter.isReplyError(err) || confirm) {
          // A refused WAIT after a grant: give the grant back before reporting.
          if (confirm && this._adapter.isReplyError(err)) await this._adapter.call(key, ['LEASE.RELEASE', key, token]).catch(() => undefined);
          throw err;
        }
        // The reply may have been lost after a grant: the same token asks again, and a
        // grant it already has comes back unchanged (deadline renewed).
        sentAt = now();
        reply = await once();
      }
    }
    if (confirm && reply !== null && reply !== undefined && !confirmedEnough(confirm, confirmed)) {
      await this._adapter.call(key, ['LEASE.RELEASE', key, token]).catch(() => undefined);
      throw new NotConfirmed(key, confirm.replicas, confirmed?.replicas ?? 0);
    }
    if (reply === null || reply === undefined) throw new NotAcquired(key);
    if (!Array.isArray(reply) || reply.length < 2) throw new Error(`redis-lease: unexpected ACQUIRE reply ${String(reply)}`);
    const fence = Number(reply[1]);
    if (!Number.isSafeInteger(fence) || fence < 0) throw new Error(`redis-lease: fence ${String(reply[1])} is not exact`);

    const Ctor = isSession ? Session : Lease;
    const lease = new Ctor(this, key, String(reply[0]), fence, ttlMs, sentAt, { ...opts, confirm: confirm ?? null });
    lease._replicas = confirmed?.replicas;
    lease._aofLocal = confirmed?.aofLocal;
    if (ttlMs > 0 && now() - sentAt > ttlMs / 3) {
      // Granted after waiting: its deadline counts from the grant, which happened some
      // time after the request was sent. A renewal confirms a deadline measured from now.
      const again = now();
      const [r] = await this._batch([{ key, args: ['LEASE.RENEW', key, lease.token, ttlMs] }], confirm);
      if (!r!.ok) throw r!.error;
      if (Number(r!.value) !== 1) throw new NotAcquired(key, `lease on ${key} granted after waiting but lost before it was confirmed`);
      if (confirm && !confirmedEnough(confirm, r)) {
        await this._adapter.call(key, ['LEASE.RELEASE', key, lease.token]).catch(() => undefined);
        throw new NotConfirmed(key, confirm.replicas, r!.replicas ?? 0);
      }
      lease._confirmedUntil = again + ttlMs;
      lease._nextRenewAt = again + ttlMs / 3;
    }
    if (this.closed) {
      await this._adapter.call(key, ['LEASE.RELEASE', key, lease.token]).catch(() => undefined);
      throw new Error('redis-lease: Leases closed');
    }
    this.all.add(lease);
    if (session) session._holds.add(lease);
    if (!lease._bound) {
      this.watched.add(lease);
      this.scheduleAt(Math.min(lease._nextRenewAt, lease._confirmedUntil));
    }
    return lease;
  }

  // ------------------------------------------------------------------ state

  /** @internal */
  _setState(lease: Lease, state: LeaseState): void {
    if (lease._state === 'lost' || lease._state === 'released') return;
    lease._state = state;
    if (state === 'lost' || state === 'released') {
      this._unwatch(lease);
      this.all.delete(lease);
      lease.session?._holds.delete(lease);
    }
  }

  /** @internal */
  _lose(lease: Lease, why: string, cause?: unknown): void {
    if (lease._state === 'lost' || lease._state === 'released') return;
    const err = new LeaseLost(lease.key, lease.fence, why, cause === undefined ? undefined : { cause });
    this._setState(lease, 'lost');
    if (lease instanceof Session) this._endSession(lease, 'lost');
    lease._abort.abort(err);
  }

  /** @internal the holds bound to a session that ended are free on the server */
  _endSession(session: Session, how: 'lost' | 'released'): void {
    for (const hold of [...session._holds]) {
      this._lose(hold, `its session ${session.key} was ${how}`);
    }
  }

  /** @internal */
  _unwatch(lease: Lease): void {
    this.watched.delete(lease);
  }

  /** @internal a renewal sent at `sentAt` was answered 1 */
  _confirm(lease: Lease, sentAt: number, ttlMs: number): void {
    if (lease._state !== 'held' && lease._state !== 'suspended') return;
    lease._confirmedUntil = Math.max(lease._confirmedUntil, sentAt + ttlMs);
    lease._nextRenewAt = sentAt + lease.ttlMs / 3;
    lease._renewals++;
    if (lease._state === 'suspended') this.setStateWithHolds(lease, 'held');
  }

  /**
   * @internal a fenced write went unanswered: the server may not be answering, so the
   * lease is suspended (lost at its deadline) until the watchdog, asked to renew now,
   * confirms it. A hold that lives by its session suspends the session.
   */
  _writeFailed(lease: Lease): void {
    const target = lease._bound && lease.session ? lease.session : lease;
    if (target._state !== 'held' && target._state !== 'suspended') return;
    this.setStateWithHolds(target, 'suspended');
    if (target._inflightSince < 0) target._nextRenewAt = now();
    this.reschedule();
  }

  private setStateWithHolds(lease: Lease, state: 'held' | 'suspended'): void {
    if (lease._state === state) return;
    this._setState(lease, state);
    if (lease instanceof Session) {
      for (const hold of lease._holds) if (hold._bound) this._setState(hold, state);
    }
  }

  // ------------------------------------------------------------------ watchdog

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = Infinity;
  }

  private scheduleAt(at: number): void {
    if (this.closed || this.ticking || at >= this.timerAt) return;
    this.clearTimer();
    this.timerAt = at;
    const timer = setTimeout(() => this.tick(), Math.max(0, at - now()));
    // The watchdog alone does not keep a process alive.
    timer.unref();
    this.timer = timer;
  }

  /** Renewal interval of a lease: ttl/3. */
  private static interval(lease: Lease): number {
    return lease.ttlMs / 3;
  }

  /** The ttl the next renewal asks for, clipped to the caps; 0 when renewing has stopped. */
  private static renewTtl(lease: Lease, t: number): number {
    if (!lease._autoRenew || lease._releasing) return 0;
    if (lease._maxRenewals !== undefined && lease._renewals >= lease._maxRenewals) return 0;
    if (lease._maxHoldMs !== undefined) {
      const left = Math.floor(lease._acquiredAt + lease._maxHoldMs - t);
      return left >= 1 ? Math.min(lease.ttlMs, left) : 0;
    }
    return lease.ttlMs;
  }

  private tick(): void {
    this.timer = undefined;
    this.timerAt = Infinity;
    if (this.closed) return;
    this.ticking = true;
    try {
      const t = now();
      let anyDue = false;
      for (const lease of this.watched) {
        lease._refresh();
        if (lease._state !== 'held' && lease._state !== 'suspended') continue;
        if (lease._inflightSince >= 0) {
          if (lease._state === 'held' && t - lease._inflightSince >= Leases.interval(lease)) {
            this.setStateWithHolds(lease, 'suspended');
          }
        } else if (lease._nextRenewAt <= t && Leases.renewTtl(lease, t) > 0) {
          anyDue = true;
        }
      }
      if (anyDue) this.renewDue(t);
    } finally {
      this.ticking = false;
    }
    this.reschedule();
  }

  /**
   * Renew every lease due now and, riding along, those due within half an interval:
   * leases acquired together stay in one batch from then on.
   */
  private renewDue(t: number): void {
    const batch: Array<{ lease: Lease; ttl: number }> = [];
    for (const lease of this.watched) {
      if ((lease._state !== 'held' && lease._state !== 'suspended') || lease._inflightSince >= 0) continue;
      if (lease._nextRenewAt > t + Leases.interval(lease) / 2) continue;
      const ttl = Leases.renewTtl(lease, t);
      if (ttl > 0) batch.push({ lease, ttl });
    }
    if (!batch.length) return;
    for (const b of batch) b.lease._inflightSince = t;
    this.counters.renewalBatches++;
    this.counters.renewalsSent += batch.length;
    // One batch per confirmation asked for (most often all leases ask the same).
    const bySpec = new Map<string, Array<{ lease: Lease; ttl: number }>>();
    for (const b of batch) {
      const c = b.lease._confirm;
      const spec = c ? `${c.replicas}:${c.timeoutMs ?? DEFAULT_CONFIRM_MS}:${c.aof === true}` : '';
      let list = bySpec.get(spec);
      if (!list) bySpec.set(spec, (list = []));
      list.push(b);
    }
    for (const group of bySpec.values()) {
      const items: BatchItem[] = group.map(({ lease, ttl }) => ({
        key: lease.key,
        args: ['LEASE.RENEW', lease.key, lease.token, ttl],
      }));
      this._inflight++;
      this._batch(items, group[0]!.lease._confirm).then(
        (results) => {
          this._inflight--;
          group.forEach(({ lease, ttl }, i) => this.renewed(lease, t, ttl, results[i]!));
          this.reschedule();
        },
        (error: unknown) => {
          this._inflight--;
          for (const { lease, ttl } of group) this.renewed(lease, t, ttl, { ok: false, error });
          this.reschedule();
        },
      );
    }
  }

  /** @internal a renewal's answer, from the watchdog or `renew()` */
  _renewed(lease: Lease, sentAt: number, ttl: number, r: { ok: boolean; value?: unknown; error?: unknown; replicas?: number; aofLocal?: number }): void {
    this.renewed(lease, sentAt, ttl, r);
  }

  private renewed(
    lease: Lease,
    sentAt: number,
    ttl: number,
    r: { ok: boolean; value?: unknown; error?: unknown; replicas?: number; aofLocal?: number },
  ): void {
    lease._inflightSince = -1;
    if (lease._state !== 'held' && lease._state !== 'suspended') return;
    if (r.ok) {
      if (Number(r.value) !== 1) {
        this._lose(lease, 'the server refused the renewal (not held by this token)');
        return;
      }
      if (lease._confirm) {
        lease._replicas = r.replicas;
        lease._aofLocal = r.aofLocal;
        if (!confirmedEnough(lease._confirm, r)) {
          // A failover now could promote a replica that never saw this renewal.
          this._lose(lease, `a renewal was confirmed by ${r.replicas ?? 0} of ${lease._confirm.replicas} replicas`);
          return;
        }
      }
      this._confirm(lease, sentAt, ttl);
      return;
    }
    if (lease._confirm && this._adapter.isReplyError(r.error) && /WAIT/i.test(String((r.error as Error).message))) {
      this._lose(lease, 'the server refused the renewal\'s WAIT', r.error);
      return;
    }
    if (this._adapter.isReplyError(r.error) && /^WRONGTYPE/.test(String((r.error as Error).message))) {
      this._lose(lease, 'its key was overwritten by another type', r.error);
      return;
    }
    // Unreachable, or a transient error: suspended until the deadline last confirmed,
    // and retried sooner than the usual interval.
    this.setStateWithHolds(lease, 'suspended');
    lease._nextRenewAt = now() + Math.min(Leases.interval(lease) / 2, 250);
  }

  private reschedule(): void {
    if (this.closed) return;
    let at = Infinity;
    const t = now();
    for (const lease of this.watched) {
      if (lease._state !== 'held' && lease._state !== 'suspended') continue;
      at = Math.min(at, lease._confirmedUntil);
      if (lease._inflightSince >= 0) {
        if (lease._state === 'held') at = Math.min(at, lease._inflightSince + Leases.interval(lease));
      } else if (Leases.renewTtl(lease, Math.max(t, lease._nextRenewAt)) > 0) {
        at = Math.min(at, lease._nextRenewAt);
      }
    }
    // Bound holds follow their session, which is watched; nothing of their own is due.
    if (at === Infinity) {
      this.clearTimer();
      return;
    }
    if (at < this.timerAt || this.timer === undefined) {
      this.timerAt = Infinity;
      this.scheduleAt(at);
    }
  }
}
