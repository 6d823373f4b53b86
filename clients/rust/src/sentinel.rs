//! Sentinel as a topology: a connection to the master that a set of Sentinels name,
//! asked again before every renewal round, so that the watchdog follows a failover.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    Pipeline, RedisFuture, RedisResult, Value,
};

use crate::connection::{Connect, Connection};
use crate::fenced::is_demoted;

/// How long one Sentinel may take to answer before the next is asked.
const SENTINEL_TIMEOUT: Duration = Duration::from_secs(1);

/// A multiplexed connection to the master that a set of Sentinels name, following a
/// failover: hand it to [`Leases::connect_sentinel`](crate::Leases::connect_sentinel)
/// and use clones of it for your own commands.
///
/// - It asks the Sentinels (`SENTINEL MASTER name`, in the order given, each bounded by
///   a second) for the master when it first connects, before every renewal round of the
///   watchdog, and after a failure; the first Sentinel that names a master it does not
///   see down is believed. When none answers, the master last named is kept.
/// - A `READONLY` reply (the server was demoted to a replica) or a connection error
///   makes it ask again before the next command: for the watchdog `READONLY` is a lost
///   connection, not an answer.
/// - Commands are not resent: a command whose connection failed returns the error.
///
/// Cheap to clone; clones share the connection and what the Sentinels said.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    sentinels: Vec<ConnectionInfo>,
    master_name: String,
    /// The data nodes' settings (password, database, protocol); its address is replaced
    /// by the master's.
    node: ConnectionInfo,
    config: AsyncConnectionConfig,
    state: Mutex<Current>,
    /// One discovery at a time.
    asking: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Current {
    master: Option<(String, u16)>,
    conn: Option<MultiplexedConnection>,
    /// Connections to the Sentinels, by index, kept between rounds.
    sentinels: HashMap<usize, MultiplexedConnection>,
    /// A failure or `READONLY` was seen: ask the Sentinels before the next command.
    stale: bool,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master_name", &self.inner.master_name)
            .field("master", &self.master())
            .finish()
    }
}

impl SentinelConnection {
    /// Connects to the master named `master_name` by `sentinels` (addresses such as
    /// `"redis://127.0.0.1:26379"`), with the default settings for the data nodes.
    pub async fn connect<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> RedisResult<SentinelConnection> {
        let node = "redis://127.0.0.1:6379".into_connection_info()?;
        SentinelConnection::connect_with(sentinels, master_name, node).await
    }

    /// As [`SentinelConnection::connect`], with the data nodes' settings (password,
    /// database, protocol) from `node`; its address is ignored (the Sentinels name it).
    pub async fn connect_with<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
        node: ConnectionInfo,
    ) -> RedisResult<SentinelConnection> {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()?;
        if sentinels.is_empty() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no Sentinel address given",
            )));
        }
        let conn = SentinelConnection {
            inner: Arc::new(Inner {
                sentinels,
                master_name: master_name.to_string(),
                node,
                config: AsyncConnectionConfig::new(),
                state: Mutex::new(Current::default()),
                asking: tokio::sync::Mutex::new(()),
            }),
        };
        conn.connection().await?;
        Ok(conn)
    }

    /// The master as the Sentinels last named it.
    pub fn master(&self) -> Option<(String, u16)> {
        self.inner.state().master.clone()
    }

    /// The connection to the master, (re)connecting after asking the Sentinels if the
    /// last one failed.
    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.inner.usable() {
            return Ok(conn);
        }
        let _asking = self.inner.asking.lock().await;
        if let Some(conn) = self.inner.usable() {
            return Ok(conn);
        }
        let (known, stale) = {
            let state = self.inner.state();
            (state.master.clone(), state.stale)
        };
        let master = match known {
            // Named by the last round's discovery, not connected yet.
            Some(master) if !stale => master,
            _ => match self.inner.discover(None).await {
                Ok(master) => master,
                Err(e) => known.ok_or(e)?,
            },
        };
        let conn = self
            .inner
            .client_for(&master)?
            .get_multiplexed_async_connection_with_config(&self.inner.config)
            .await?;
        let mut state = self.inner.state();
        state.master = Some(master);
        state.conn = Some(conn.clone());
        state.stale = false;
        Ok(conn)
    }

    fn observe<T>(&self, reply: &RedisResult<T>, values: Option<&[Value]>) {
        let failed = match reply {
            Err(e) => is_demoted(e) || e.is_io_error() || e.is_connection_dropped(),
            Ok(_) => values.is_some_and(|values| {
                values
                    .iter()
                    .any(|v| matches!(v, Value::ServerError(e) if e.code() == "READONLY"))
            }),
        };
        if failed {
            self.inner.mark_stale();
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, Current> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn usable(&self) -> Option<MultiplexedConnection> {
        let state = self.state();
        if state.stale {
            return None;
        }
        state.conn.clone()
    }

    fn mark_stale(&self) {
        let mut state = self.state();
        state.stale = true;
        state.conn = None;
    }

    fn client_for(&self, (host, port): &(String, u16)) -> RedisResult<Client> {
        let info = self
            .node
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.clone(), *port));
        Client::open(info)
    }

    /// Asks the Sentinels in turn, each for at most a second (and all together for at
    /// most `within`), for the master; the first that names one it does not see down
    /// is believed.
    async fn discover(&self, within: Option<Duration>) -> RedisResult<(String, u16)> {
        let started = tokio::time::Instant::now();
        let mut last_error = None;
        for index in 0..self.sentinels.len() {
            let mut limit = SENTINEL_TIMEOUT;
            if let Some(within) = within {
                let left = within.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break;
                }
                limit = limit.min(left);
            }
            match tokio::time::timeout(limit, self.ask(index)).await {
                Ok(Ok(Some(master))) => return Ok(master),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {
                    self.state().sentinels.remove(&index);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::Io,
                "no Sentinel named a master that is up",
            ))
        }))
    }

    /// What Sentinel `index` says: the master, or None when it sees it down.
    async fn ask(&self, index: usize) -> RedisResult<Option<(String, u16)>> {
        let cached = self.state().sentinels.get(&index).cloned();
        let mut conn = match cached {
            Some(conn) => conn,
            None => {
                let conn = Client::open(self.sentinels[index].clone())?
                    .get_multiplexed_async_connection_with_config(
                        &AsyncConnectionConfig::new().set_response_timeout(None),
                    )
                    .await?;
                self.state().sentinels.insert(index, conn.clone());
                conn
            }
        };
        let fields: RedisResult<HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.master_name)
            .query_async(&mut conn)
            .await;
        let fields = match fields {
            Ok(fields) => fields,
            Err(e) => {
                self.state().sentinels.remove(&index);
                return Err(e);
            }
        };
        let flags = fields.get("flags").map(String::as_str).unwrap_or("");
        if flags.split(',').any(|f| f == "s_down" || f == "o_down") {
            return Ok(None);
        }
        let host = fields.get("ip").cloned();
        let port = fields.get("port").and_then(|p| p.parse::<u16>().ok());
        Ok(host.zip(port))
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            let reply = conn.req_packed_command(cmd).await;
            let single = reply.as_ref().ok().map(std::slice::from_ref);
            self.observe(&reply, single);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.connection().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            let values = reply.as_ref().ok().map(Vec::as_slice);
            self.observe(&reply, values);
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.node.redis_settings().db()
    }
}

impl Connection for SentinelConnection {
    fn clone_boxed(&self) -> Box<dyn Connection> {
        Box::new(self.clone())
    }

    fn locate(&self, within: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Ok(_asking) = self.inner.asking.try_lock() else {
                // Another discovery is under way; it will do.
                return;
            };
            // No answer keeps the master last named: still the best guess.
            if let Ok(master) = self.inner.discover(Some(within)).await {
                let mut state = self.inner.state();
                if state.master.as_ref() != Some(&master) {
                    state.master = Some(master);
                    state.conn = None;
                }
            }
        })
    }
}

impl Connect for SentinelConnection {
    fn connect_blocking(
        &self,
        response_timeout: Option<Duration>,
    ) -> BoxFuture<'_, RedisResult<Box<dyn Connection>>> {
        Box::pin(async move {
            // Through the shared connection's discovery: the master the Sentinels name now.
            self.connection().await?;
            let master = self.master().ok_or_else(|| {
                redis::RedisError::from((redis::ErrorKind::Io, "no master known"))
            })?;
            let config = AsyncConnectionConfig::new().set_response_timeout(response_timeout);
            let conn = self
                .inner
                .client_for(&master)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok(Box::new(conn) as Box<dyn Connection>)
        })
    }

    fn demoted(&self) {
        self.inner.mark_stale();
    }
}
