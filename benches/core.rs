//! Criterion micro benches of the pure core: the lease state machine and the fence
//! sequence (`model/src/lease/`) and the deadline index (`model/src/index.rs`), through
//! the model crate the module builds on. Run: `cargo bench --bench core`.

use redis_lease_model::{index, lease};

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

use index::DeadlineIndex;
use lease::{Acquire, FenceSequence, Lease, Request};
use redis_lease_model::holds::Unbound;

const T0: u64 = 1_700_000_000_000;
const TOKEN: &[u8; 32] = b"0123456789abcdef0123456789abcdef";
const OTHER: &[u8; 32] = b"0123456789abcdef0123456789abcdeX";
/// Keys in the deadline index for the index benches.
const INDEX_KEYS: usize = 100_000;

fn key(i: usize) -> Vec<u8> {
    format!("bench:{i:08}").into_bytes()
}

fn bench_lease(c: &mut Criterion) {
    let mut g = c.benchmark_group("lease");
    g.bench_function("acquire free", |b| {
        let mut fences = FenceSequence::new();
        b.iter_batched_ref(
            Lease::default,
            |lease| {
                let r = lease.acquire(
                    Request::plain(black_box(TOKEN), 30_000, T0),
                    &mut fences,
                    &mut Unbound,
                );
                debug_assert!(matches!(r, Ok((Acquire::Granted { .. }, _))));
                black_box(r)
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("acquire busy", |b| {
        let mut fences = FenceSequence::new();
        let mut lease = Lease::default();
        let _ = lease.acquire(Request::plain(TOKEN, 30_000, T0), &mut fences, &mut Unbound);
        b.iter(|| {
            black_box(lease.acquire(
                Request::plain(black_box(OTHER), 30_000, T0 + 1),
                &mut fences,
                &mut Unbound,
            ))
        })
    });
    g.bench_function("renew", |b| {
        let mut fences = FenceSequence::new();
        let mut lease = Lease::default();
        let _ = lease.acquire(Request::plain(TOKEN, 30_000, T0), &mut fences, &mut Unbound);
        let mut now = T0;
        b.iter(|| {
            now += 1;
            black_box(lease.renew(black_box(TOKEN), 30_000, now, &mut Unbound))
        })
    });
    g.bench_function("release", |b| {
        let mut fences = FenceSequence::new();
        b.iter_batched_ref(
            || {
                let mut lease = Lease::default();
                let _ = lease.acquire(Request::plain(TOKEN, 30_000, T0), &mut fences, &mut Unbound);
                lease
            },
            |lease| black_box(lease.release(black_box(TOKEN), T0 + 1, &mut Unbound)),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("fence next", |b| {
        let mut fences = FenceSequence::new();
        b.iter(|| black_box(fences.next(0, black_box(T0))))
    });
    g.finish();
}

/// An index of `INDEX_KEYS` keys with deadlines spread over 100 s.
fn filled_index() -> (DeadlineIndex, Vec<Vec<u8>>) {
    let keys: Vec<Vec<u8>> = (0..INDEX_KEYS).map(key).collect();
    let mut idx = DeadlineIndex::new();
    for (i, k) in keys.iter().enumerate() {
        idx.insert(T0 + (i as u64 * 7919) % 100_000, 0, k);
    }
    (idx, keys)
}

fn bench_index(c: &mut Criterion) {
    let mut g = c.benchmark_group("deadline index (100k keys)");
    g.bench_function("insert + remove", |b| {
        // A fresh key in and out again, so the index keeps its size.
        let (mut idx, _) = filled_index();
        let fresh: Vec<Vec<u8>> = (INDEX_KEYS..INDEX_KEYS + 1024).map(key).collect();
        let mut i = 0;
        b.iter(|| {
            let k = &fresh[i % fresh.len()];
            let deadline = T0 + (i as u64 * 7919) % 100_000;
            idx.insert(black_box(deadline), 0, k);
            black_box(idx.remove(deadline, 0, k));
            i += 1;
        })
    });
    g.bench_function("pop_due x1000", |b| {
        b.iter_batched_ref(
            || filled_index().0,
            |idx| {
                // Everything is due: the reaper's view after a mass expiry.
                for _ in 0..1_000 {
                    black_box(idx.pop_due(T0 + 200_000));
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench_lease, bench_index);
criterion_main!(benches);
