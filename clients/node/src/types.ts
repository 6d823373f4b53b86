/**
 * Named types on top of the module's holds: a mutex (exclusive), a read/write lock
 * (`SHARED` for readers, exclusive for the writer, one key) and a semaphore
 * (`SHARED LIMIT permits`). Each hands out ordinary Leases (fence, signal, watchdog)
 * and has the scoped form `runExclusive(fn)`, which acquires, runs, releases, and
 * throws LeaseLost when the hold was lost while `fn` ran.
 */
import type { AcquireOptions, Lease, LeaseBody, Leases } from './leases';

/** Acquire options a named type fixes itself (the mode and the limit). */
export type HoldOptions = Omit<AcquireOptions, 'shared' | 'limit'>;

/** An exclusive lock on one key. */
export class Mutex {
  constructor(
    private readonly leases: Leases,
    readonly key: string,
    private readonly defaults: HoldOptions = {},
  ) {}

  acquire(opts: HoldOptions = {}): Promise<Lease> {
    return this.leases.acquire(this.key, { ...this.defaults, ...opts });
  }

  runExclusive<T>(fn: LeaseBody<T>, opts: HoldOptions = {}): Promise<T> {
    return this.leases.using(this.key, { ...this.defaults, ...opts }, fn);
  }
}

/**
 * A read/write lock on one key: many readers at once, or one writer. Waiting (`blockMs`)
 * is first come, first served across both modes, so readers cannot starve a writer.
 */
export class ReadWriteLock {
  constructor(
    private readonly leases: Leases,
    readonly key: string,
    private readonly defaults: HoldOptions = {},
  ) {}

  /** A shared (read) hold. */
  read(opts: HoldOptions = {}): Promise<Lease> {
    return this.leases.acquire(this.key, { ...this.defaults, ...opts, shared: true });
  }

  /** The exclusive (write) hold. */
  write(opts: HoldOptions = {}): Promise<Lease> {
    return this.leases.acquire(this.key, { ...this.defaults, ...opts });
  }

  runRead<T>(fn: LeaseBody<T>, opts: HoldOptions = {}): Promise<T> {
    return this.leases.using(this.key, { ...this.defaults, ...opts, shared: true }, fn);
  }

  runWrite<T>(fn: LeaseBody<T>, opts: HoldOptions = {}): Promise<T> {
    return this.leases.using(this.key, { ...this.defaults, ...opts }, fn);
  }
}

/**
 * A semaphore of `permits` on one key: at most that many holders at once. Every user of
 * the key must state the same number (the server refuses another with
 * `ERR LIMIT does not match`).
 */
export class Semaphore {
  constructor(
    private readonly leases: Leases,
    readonly key: string,
    readonly permits: number,
    private readonly defaults: HoldOptions = {},
  ) {
    if (!Number.isInteger(permits) || permits < 1 || permits > 1_000_000) {
      throw new RangeError(`redis-lease: permits must be an integer from 1 to 1000000, got ${permits}`);
    }
  }

  /** One permit. */
  acquire(opts: HoldOptions = {}): Promise<Lease> {
    return this.leases.acquire(this.key, { ...this.defaults, ...opts, shared: true, limit: this.permits });
  }

  runExclusive<T>(fn: LeaseBody<T>, opts: HoldOptions = {}): Promise<T> {
    return this.leases.using(this.key, { ...this.defaults, ...opts, shared: true, limit: this.permits }, fn);
  }
}
