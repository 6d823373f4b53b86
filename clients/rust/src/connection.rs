use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// A connection [`Leases`](crate::Leases) sends its commands on: multiplexed, cheap to
/// clone, shared by the watchdog and every lease.
///
/// Implemented for [`ConnectionManager`] (reconnects by itself: the usual choice),
/// [`MultiplexedConnection`] and the cluster [`ClusterConnection`].
pub trait Connection: ConnectionLike + Send + Sync + 'static {
    /// A clone of this connection (a handle to the same multiplexed connection).
    fn clone_boxed(&self) -> Box<dyn Connection>;

    /// Whether a pipeline must keep to one hash slot, as a cluster connection's must:
    /// the watchdog then sends one pipeline per slot, all at once.
    fn is_cluster(&self) -> bool {
        false
    }

    /// Finds out where commands should go now, in at most `within`: called before each
    /// renewal round. A [`SentinelConnection`](crate::SentinelConnection) asks the
    /// Sentinels for the master; the others have nothing to do.
    fn locate(&self, within: Duration) -> BoxFuture<'_, ()> {
        let _ = within;
        Box::pin(std::future::ready(()))
    }
}

impl Connection for ConnectionManager {
    fn clone_boxed(&self) -> Box<dyn Connection> {
        Box::new(self.clone())
    }
}

impl Connection for MultiplexedConnection {
    fn clone_boxed(&self) -> Box<dyn Connection> {
        Box::new(self.clone())
    }
}

impl Connection for ClusterConnection {
    fn clone_boxed(&self) -> Box<dyn Connection> {
        Box::new(self.clone())
    }

    fn is_cluster(&self) -> bool {
        true
    }
}

/// Opens a connection of its own for each blocking acquire, and the one fenced writes go
/// on.
///
/// A command blocked in `LEASE.ACQUIRE ... BLOCK` holds up every command behind it on
/// its connection, the watchdog's renewals included, and a shared connection's response
/// timeout (500 ms by default for a [`ConnectionManager`]) would cut the wait short. So
/// a blocking acquire never goes on the shared connection: it opens one through this,
/// with a response timeout a little longer than the wait, and drops it after.
///
/// Implemented for [`redis::Client`] and [`ClusterClient`]. A cluster client keeps its
/// own overall response timeout (set when it was built): give [`Leases`](crate::Leases)
/// one without, or with one longer than the longest wait.
pub trait Connect: Send + Sync + 'static {
    /// A new connection whose responses may take up to `response_timeout` (`None`: no
    /// limit).
    fn connect_blocking(
        &self,
        response_timeout: Option<Duration>,
    ) -> BoxFuture<'_, RedisResult<Box<dyn Connection>>>;

    /// A connection opened through this answered `READONLY`: the server it reached is a
    /// replica now. A [`SentinelConnection`](crate::SentinelConnection) asks the
    /// Sentinels again before the next connection.
    fn demoted(&self) {}
}

impl Connect for redis::Client {
    fn connect_blocking(
        &self,
        response_timeout: Option<Duration>,
    ) -> BoxFuture<'_, RedisResult<Box<dyn Connection>>> {
        Box::pin(async move {
            let config = AsyncConnectionConfig::new().set_response_timeout(response_timeout);
            let conn = self
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok(Box::new(conn) as Box<dyn Connection>)
        })
    }
}

impl Connect for ClusterClient {
    fn connect_blocking(
        &self,
        response_timeout: Option<Duration>,
    ) -> BoxFuture<'_, RedisResult<Box<dyn Connection>>> {
        Box::pin(async move {
            let mut config = ClusterConfig::new();
            if let Some(timeout) = response_timeout {
                config = config.set_response_timeout(timeout);
            }
            let conn = self.get_async_connection_with_config(config).await?;
            Ok(Box::new(conn) as Box<dyn Connection>)
        })
    }
}

/// A boxed [`Connection`] that is itself a `ConnectionLike` (for `query_async`) and
/// `Clone`.
pub(crate) struct Conn(Box<dyn Connection>);

impl Conn {
    pub(crate) fn new(conn: Box<dyn Connection>) -> Self {
        Conn(conn)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.0.is_cluster()
    }

    pub(crate) async fn locate(&self, within: Duration) {
        self.0.locate(within).await;
    }
}

impl Clone for Conn {
    fn clone(&self) -> Self {
        Conn(self.0.clone_boxed())
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// The hash slot of a key (CRC16/XMODEM of the key or of its `{hash tag}`, mod 16384),
/// to split a cluster's renewals into one pipeline per slot.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc = 0u16;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn slots_match_redis() {
        // Values from CLUSTER KEYSLOT.
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"bar", 5061),
            (b"{user1000}.following", 3443),
            (b"{user1000}.followers", 3443),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"foo{bar}{zap}", 5061),
            (b"", 0),
        ] {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }
}
