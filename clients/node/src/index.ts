export { Lease, Leases, Session } from './leases';
export type { AcquireOptions, ConfirmOptions, LeaseBody, LeasesOptions, LeaseState, SessionOptions, WatchdogStats } from './leases';
export { LeaseError, LeaseLost, NotAcquired, NotConfirmed, StaleFence, WriteIndeterminate } from './errors';
export { IoRedisAdapter, NodeRedisAdapter, NodeRedisSentinelAdapter, Unanswered, adapterFor } from './adapter';
export type {
  AnyNodeRedis,
  Arg,
  BatchItem,
  BatchResult,
  CreateClient,
  IoRedisLike,
  IoRedisPipelineLike,
  LeaseAdapter,
  NodeRedisClientLike,
  NodeRedisClusterLike,
  NodeRedisSentinelLike,
} from './adapter';
export { Mutex, ReadWriteLock, Semaphore } from './types';
export type { HoldOptions } from './types';
export { Redlock, RedlockError, RedlockLock, ResourceLockedError } from './redlock';
export type { RedlockAbortSignal, RedlockSettings } from './redlock';
