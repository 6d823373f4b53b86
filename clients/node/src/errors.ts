/** Base class of every error this package throws on purpose. */
export class LeaseError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** `LEASE.ACQUIRE` answered nil: the key is held, or `blockMs` passed before it was free. */
export class NotAcquired extends LeaseError {
  readonly key: string;
  constructor(key: string, message = `lease on ${key} not acquired`) {
    super(message);
    this.key = key;
  }
}

/**
 * The key was granted, but fewer replicas than `confirm.replicas` acknowledged it within
 * the timeout: the grant was released again. Retry, or acquire without confirmation.
 */
export class NotConfirmed extends NotAcquired {
  readonly wanted: number;
  readonly replicas: number;
  constructor(key: string, wanted: number, replicas: number) {
    super(key, `lease on ${key} granted but confirmed by ${replicas} of ${wanted} replicas: released`);
    this.wanted = wanted;
    this.replicas = replicas;
  }
}

/**
 * The lease is gone: a renewal was refused, its deadline passed without a confirmed
 * renewal, its session ended, or a fenced write was refused as stale. It is the
 * `reason` of `lease.signal` and what `leases.using()` throws.
 */
export class LeaseLost extends LeaseError {
  readonly key: string;
  readonly fence: number;
  /** What happened, in a few words. */
  readonly why: string;
  constructor(key: string, fence: number, why: string, options?: { cause?: unknown }) {
    super(`lease on ${key} (fence ${fence}) lost: ${why}`, options);
    this.key = key;
    this.fence = fence;
    this.why = why;
  }
}

/** `LEASE.FENCE` refused the write: the resource already accepted a newer fence. */
export class StaleFence extends LeaseError {
  readonly resource: string;
  readonly fence: number;
  /** The highest fence the resource has accepted, as the server reported it. */
  readonly highest: number;
  constructor(resource: string, fence: number, highest: number, serverMessage: string) {
    super(`${resource}: ${serverMessage}`);
    this.resource = resource;
    this.fence = fence;
    this.highest = highest;
  }
}

const STALE_RE = /^STALE fencing token (\d+) is older than (\d+)/;

/** The StaleFence for a server error, or undefined when it is not a STALE reply. */
export function staleFenceFrom(resource: string, err: unknown): StaleFence | undefined {
  const message = err instanceof Error ? err.message : String(err);
  const m = STALE_RE.exec(message);
  if (!m) return undefined;
  return new StaleFence(resource, Number(m[1]), Number(m[2]), message);
}

/**
 * A fenced write (`fenceCall`) was sent and no reply came before the lease's deadline, or
 * its connection failed after sending: it may have run once (on the server it reached,
 * even after this error), or not at all. It is never sent again unless the call asked
 * for `retries`. The lease is `suspended` until a renewal confirms it, and `lost` once
 * its deadline has passed: read `lease.state`. The last attempt's error is `cause`.
 */
export class WriteIndeterminate extends LeaseError {
  readonly key: string;
  readonly resource: string;
  readonly fence: number;
  /** How many times the write was sent. */
  readonly attempts: number;
  constructor(key: string, resource: string, fence: number, attempts: number, options?: { cause?: unknown }) {
    super(
      `fenced write to ${resource} (lease on ${key}, fence ${fence}) got no reply before the lease's deadline ` +
        `or lost its connection: it may or may not have run`,
      options,
    );
    this.key = key;
    this.resource = resource;
    this.fence = fence;
    this.attempts = attempts;
  }
}
