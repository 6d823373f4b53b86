use std::fmt;

use redis::RedisError;

/// Everything a lease operation can fail with.
///
/// The first three and [`Error::WriteIndeterminate`] are the contract shared with the
/// Python and Node clients; the rest are this client's own.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// `LEASE.ACQUIRE` answered nil: the key is held (or, with `block`, the wait ended
    /// first). Never a silent `None`.
    NotAcquired {
        /// The lease key.
        key: String,
    },
    /// The lease ended without its holder releasing it: a renewal was answered `0`,
    /// its deadline passed without a confirmed renewal, its session ended, a fenced write
    /// was refused as stale, or [`Leases::close`](crate::Leases::close) ran while it was
    /// held.
    LeaseLost {
        /// The lease key.
        key: String,
    },
    /// `LEASE.FENCE` refused the write: the resource has accepted a higher fence, so a
    /// later holder has written and this one must not.
    StaleFence {
        /// The resource key of the fenced write.
        resource: String,
        /// The fence this write carried.
        fence: u64,
        /// The highest fence the resource has accepted.
        highest: u64,
    },
    /// A fenced write ([`Lease::fence_call`](crate::Lease::fence_call)) was sent and no
    /// reply came before the lease's deadline, or its connection failed after it was
    /// sent: it may have run once (on the server it reached, even after this error: a
    /// stalled server runs it when it wakes), or not at all. Distinct from a refusal
    /// ([`Error::StaleFence`]): nothing is known of the write. It is never sent again
    /// unless the call asked for retries
    /// ([`Lease::fence_call_retrying`](crate::Lease::fence_call_retrying)). The lease
    /// is [`State::Suspended`](crate::State::Suspended) until a renewal confirms it, and
    /// [`State::Lost`](crate::State::Lost) once its deadline passes (a write that waited
    /// until the deadline finds it lost).
    WriteIndeterminate {
        /// The resource key of the fenced write.
        resource: String,
        /// The fence the write carried.
        fence: u64,
        /// How many times it was sent (1 unless retries were asked for).
        attempts: u32,
    },
    /// The key was granted but not confirmed ([`Confirm`](crate::Confirm)): fewer
    /// replicas (or AOF fsyncs) than asked for acknowledged the grant in time. The
    /// grant was released.
    NotConfirmed {
        /// The lease key.
        key: String,
        /// What the server reported.
        confirmed: crate::Confirmed,
    },
    /// [`Leases::close`](crate::Leases::close) has run: no more acquires.
    Closed,
    /// A blocking acquire (`block`) on a [`Leases`](crate::Leases) that cannot open a
    /// connection of its own for it (see [`Leases::blocking_client`](crate::Leases::blocking_client)).
    NoBlockingConnection,
    /// Anything else from the server or the connection (a timeout, `CROSSSLOT`, `ERR
    /// this token holds the lease in the other mode`, ...).
    Redis(RedisError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the lease is gone: [`Error::LeaseLost`] or [`Error::StaleFence`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. } | Error::StaleFence { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAcquired { key } => write!(f, "lease {key:?} not acquired"),
            Error::LeaseLost { key } => write!(f, "lease {key:?} lost"),
            Error::StaleFence {
                resource,
                fence,
                highest,
            } => write!(
                f,
                "stale fence on {resource:?}: {fence} is older than {highest}"
            ),
            Error::WriteIndeterminate {
                resource,
                fence,
                attempts,
            } => write!(
                f,
                "fenced write to {resource:?} (fence {fence}) got no reply in time after \
                 {attempts} attempt(s): it may or may not have run"
            ),
            Error::NotConfirmed { key, confirmed } => write!(
                f,
                "lease {key:?} granted but not confirmed ({} replicas{})",
                confirmed.replicas,
                match confirmed.local {
                    Some(local) => format!(", {local} local fsync"),
                    None => String::new(),
                }
            ),
            Error::Closed => f.write_str("leases closed"),
            Error::NoBlockingConnection => f.write_str(
                "a blocking acquire needs a connection of its own: build Leases with \
                 Leases::connect or Leases::blocking_client",
            ),
            Error::Redis(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RedisError> for Error {
    fn from(e: RedisError) -> Self {
        Error::Redis(e)
    }
}

/// `STALE fencing token <fence> is older than <highest>` as an [`Error::StaleFence`].
pub(crate) fn stale_fence(e: &RedisError, resource: &str) -> Option<Error> {
    if e.code() != Some("STALE") {
        return None;
    }
    let detail = e.detail().unwrap_or("");
    let mut numbers = detail
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    let fence = numbers.next().unwrap_or(0);
    let highest = numbers.next().unwrap_or(0);
    Some(Error::StaleFence {
        resource: resource.to_string(),
        fence,
        highest,
    })
}
