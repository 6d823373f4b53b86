/**
 * node-redlock's shape (`acquire(resources, duration)`, `using()`, `release()`,
 * `extend()`) over leases on a single Redis: a switch with one line for code written
 * against node-redlock v5 that runs with one Redis client. What changes underneath: each
 * resource is a lease with a fencing token (`lock.fences`), `using()` renews through the
 * one watchdog and its signal fires when a lease is lost, and waiting can be the
 * server's fair queue (`blockMs`) instead of retry polling.
 */
import { randomBytes } from 'node:crypto';

import { LeaseError, LeaseLost, NotAcquired } from './errors';
import { type Lease, Leases, type LeasesOptions } from './leases';

export interface RedlockSettings {
  /** Attempts after the first when a resource is held (node-redlock: 10). -1: until acquired. */
  retryCount?: number;
  /** ms between attempts (node-redlock: 200). */
  retryDelay?: number;
  /** Up to this many ms added at random to each delay (node-redlock: 200). */
  retryJitter?: number;
  /** Instead of retry polling: wait in the server's first-come queue this long per resource. */
  blockMs?: number;
}

const DEFAULTS: Required<Omit<RedlockSettings, 'blockMs'>> = { retryCount: 10, retryDelay: 200, retryJitter: 200 };

/** node-redlock's ExecutionError: the lock could not be taken (or extended) within the retries. */
export class RedlockError extends LeaseError {
  constructor(
    message: string,
    /** Attempts made. */
    readonly attempts: number,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** A resource was held by someone else on the last attempt. */
export class ResourceLockedError extends RedlockError {}

/** node-redlock's AbortSignal of `using()`: `error` is set when it aborts. */
export type RedlockAbortSignal = AbortSignal & { error?: Error };

/** node-redlock's `Lock`: what `acquire()` and `extend()` return. */
export class RedlockLock {
  constructor(
    readonly redlock: Redlock,
    /** @internal */ readonly _leases: Lease[],
    /** The token shared by every resource's lease. */
    readonly value: string,
    /** Date.now() ms at which the lock expires unless extended. */
    readonly expiration: number,
    readonly attempts: number,
  ) {}

  get resources(): string[] {
    return this._leases.map((l) => l.key);
  }

  /** Each resource's fencing token, in `resources` order: pass it to the store you write. */
  get fences(): number[] {
    return this._leases.map((l) => l.fence);
  }

  release(): Promise<void> {
    return this.redlock.release(this);
  }

  extend(duration: number): Promise<RedlockLock> {
    return this.redlock.extend(this, duration);
  }
}

/**
 * `new Redlock([client])` or `new Redlock(client)`: one ioredis or node-redis client
 * (or Cluster, with every resource of a lock in one hash slot if they must hold together).
 */
export class Redlock {
  readonly leases: Leases;
  private readonly settings: Required<Omit<RedlockSettings, 'blockMs'>> & RedlockSettings;

  constructor(clients: unknown, settings: RedlockSettings = {}, options: LeasesOptions = {}) {
    const list = Array.isArray(clients) ? clients : [clients];
    if (list.length !== 1) {
      throw new TypeError('redis-lease: Redlock here runs on a single Redis (one client); leases need no quorum of independent servers');
    }
    this.leases = new Leases(list[0], options);
    this.settings = { ...DEFAULTS, ...settings };
  }

  /**
   * Takes every resource (in sorted order, so two callers cannot deadlock), each a
   * lease of `duration` ms that is not renewed: it expires unless `extend()`ed.
   */
  acquire(resources: string[], duration: number, settings: RedlockSettings = {}): Promise<RedlockLock> {
    return this.take(resources, duration, settings, false);
  }

  private async take(resources: string[], duration: number, settings: RedlockSettings, autoRenew: boolean): Promise<RedlockLock> {
    const s = { ...this.settings, ...settings };
    const keys = [...new Set(resources)].sort();
    if (!keys.length) throw new TypeError('redis-lease: no resources');
    const token = randomBytes(16).toString('hex');
    for (let attempt = 1; ; attempt++) {
      const held: Lease[] = [];
      try {
        for (const key of keys) {
          held.push(
            await this.leases.acquire(key, {
              ttlMs: duration,
              token,
              autoRenew,
              ...(s.blockMs !== undefined ? { blockMs: s.blockMs } : {}),
            }),
          );
        }
        return new RedlockLock(this, held, token, Date.now() + duration, attempt);
      } catch (err) {
        await Promise.all(held.map((l) => l.release().catch(() => false)));
        if (!(err instanceof NotAcquired)) throw err;
        if (s.retryCount !== -1 && attempt > s.retryCount) {
          throw new ResourceLockedError(`redis-lease: ${err.key} is locked by another holder (after ${attempt} attempts)`, attempt, {
            cause: err,
          });
        }
        await new Promise((r) => setTimeout(r, s.retryDelay + Math.floor(Math.random() * s.retryJitter)));
      }
    }
  }

  /** Releases every resource still held by the lock. */
  async release(lock: RedlockLock): Promise<void> {
    await Promise.all(lock._leases.map((l) => l.release().catch(() => false)));
  }

  /** Extends every resource to `duration` ms from now; RedlockError when one was lost. */
  async extend(lock: RedlockLock, duration: number): Promise<RedlockLock> {
    try {
      await Promise.all(lock._leases.map((l) => l.renew(duration)));
    } catch (err) {
      throw new RedlockError(`redis-lease: cannot extend: ${(err as Error).message}`, 1, { cause: err });
    }
    return new RedlockLock(this, lock._leases, lock.value, Date.now() + duration, lock.attempts);
  }

  /**
   * Acquire, run `routine(signal)` while the watchdog renews every resource, release.
   * `signal` aborts (with `signal.error`) when any resource's lease is lost; `using`
   * then rejects with that LeaseLost even if the routine did not look.
   */
  using<T>(resources: string[], duration: number, settings: RedlockSettings, routine: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  using<T>(resources: string[], duration: number, routine: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  async using<T>(
    resources: string[],
    duration: number,
    a: RedlockSettings | ((signal: RedlockAbortSignal) => Promise<T>),
    b?: (signal: RedlockAbortSignal) => Promise<T>,
  ): Promise<T> {
    const settings = typeof a === 'function' ? {} : a;
    const routine = typeof a === 'function' ? a : b;
    if (!routine) throw new TypeError('redis-lease: using() needs a routine');
    const lock = await this.take(resources, duration, settings, true);
    const controller = new AbortController();
    const signal = controller.signal as RedlockAbortSignal;
    const onLost = (lease: Lease) => () => {
      if (controller.signal.aborted) return;
      signal.error = lease.signal.reason as LeaseLost;
      controller.abort(signal.error);
    };
    for (const l of lock._leases) {
      if (l.signal.aborted) onLost(l)();
      else l.signal.addEventListener('abort', onLost(l), { once: true });
    }
    try {
      const result = await routine(signal);
      if (signal.aborted) throw signal.error;
      return result;
    } finally {
      await this.release(lock);
    }
  }

  /** Releases what is held and stops the watchdog; the client stays open. */
  quit(): Promise<void> {
    return this.leases.close();
  }
}
