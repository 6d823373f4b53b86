//! A real Redis Cluster (or Valkey Cluster) on loopback, built from harness servers.
//!
//! `Cluster::start(flavor, masters, replicas_per_master)` starts every node with
//! `cluster-enabled yes` and the module loaded, gives each master an equal range of the
//! 16384 slots and its own config epoch (as `redis-cli --cluster create` does, so no
//! epoch collision has to be resolved), joins them with `CLUSTER MEET`, attaches the
//! replicas with `CLUSTER REPLICATE`, and returns once every node says
//! `cluster_state:ok`, every node sees the same slot map and roles, and every replica
//! has synced. Dropping the cluster drops its servers, which stops them.
//!
//! Nodes keep their index in `nodes` for the whole test; roles change with failovers,
//! so the topology questions (`owner`, `replica_of`, `is_master`) are asked of the
//! running cluster, not remembered.
//!
//! Automatic failover is off (`cluster-replica-no-failover yes`): with a small node
//! timeout on a busy 2-core machine, a node that misses pings for a moment could be
//! failed over behind a test's back. `CLUSTER FAILOVER` (default, FORCE, TAKEOVER) is
//! manual and still works.

use std::collections::BTreeMap;
use std::thread;
use std::time::Duration;

use redis::{Connection, ConnectionLike, Value};

use super::calls::{call, text};
use super::reply::{assert_ok, pairs};
use super::{free_port, info_field, wait_until, Flavor, Server, ServerOptions};

/// `cluster-node-timeout`: small, so gossip (a node pings peers it has not heard from in
/// half of it) converges fast; large enough that a busy node is not flagged as failing.
pub const NODE_TIMEOUT_MS: u64 = 2_000;
/// Forming the cluster, a failover, a slot map converging on every node.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);
pub const SLOTS: u16 = 16_384;

/// The hash slot of a key, as Redis computes it: CRC16 (XMODEM) of the key, or of the
/// part between the first `{` and the next `}` when that part is not empty.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(hashed) % SLOTS
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The master's id for a replica, None for a master.
    pub master: Option<String>,
    pub link_connected: bool,
    /// Slot ranges served (inclusive); migration markers (`[...]`) are left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    /// Flagged as failing or not yet known (`fail`, `fail?`, `handshake`, `noaddr`).
    pub fn is_suspect(&self) -> bool {
        ["fail", "fail?", "handshake", "noaddr"]
            .iter()
            .any(|f| self.has_flag(f))
    }
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 8, "a short CLUSTER NODES line: {line:?}");
            // `ip:port@cport[,hostname]`
            let port = fields[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| {
                    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
                    let parse = |v: &str| {
                        v.parse::<u16>()
                            .unwrap_or_else(|e| panic!("slot {v:?} in {line:?}: {e}"))
                    };
                    (parse(lo), parse(hi))
                })
                .collect();
            NodeLine {
                id: fields[0].to_string(),
                port,
                flags: fields[2].split(',').map(str::to_string).collect(),
                master: (fields[3] != "-").then(|| fields[3].to_string()),
                link_connected: fields[7] == "connected",
                slots,
            }
        })
        .collect()
}

/// A node as another node sees it: id, master id (None for a master), slot ranges.
type Seen = (String, Option<String>, Vec<(u16, u16)>);

/// How a cluster is built.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub masters: usize,
    pub replicas_per_master: usize,
    /// Extra settings for every node (cluster settings are added to them).
    pub server: ServerOptions,
}

impl ClusterOptions {
    pub fn new(masters: usize, replicas_per_master: usize) -> Self {
        ClusterOptions {
            masters,
            replicas_per_master,
            server: ServerOptions::new(),
        }
    }

    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.server = self.server.config(name, value);
        self
    }
}

/// A running cluster. `nodes[0..masters]` start as masters (master `i` serving slot
/// range `i`), then the replicas of master 0, of master 1, ...
pub struct Cluster {
    pub flavor: Flavor,
    pub nodes: Vec<Server>,
    /// `CLUSTER MYID` of each node, by index.
    pub ids: Vec<String>,
}

impl Cluster {
    /// `masters` masters with `replicas_per_master` replicas each.
    pub fn start(flavor: Flavor, masters: usize, replicas_per_master: usize) -> Cluster {
        Self::start_with(flavor, ClusterOptions::new(masters, replicas_per_master))
    }

    pub fn start_with(flavor: Flavor, options: ClusterOptions) -> Cluster {
        assert!(options.masters >= 1, "a cluster needs a master");
        let count = options.masters * (1 + options.replicas_per_master);
        // Started side by side: each start waits for PING.
        let nodes: Vec<Server> = thread::scope(|scope| {
            let starts: Vec<_> = (0..count)
                .map(|_| {
                    let server_options = node_options(&options.server);
                    scope.spawn(move || Server::start_with(flavor, server_options))
                })
                .collect();
            starts
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
        let ids: Vec<String> = nodes
            .iter()
            .map(|n| text(query(n, &["CLUSTER", "MYID"])))
            .collect();
        let cluster = Cluster { flavor, nodes, ids };
        cluster.form(&options);
        cluster
    }

    fn form(&self, options: &ClusterOptions) {
        let masters = options.masters;
        for (i, node) in self.nodes.iter().enumerate() {
            let epoch = (i + 1).to_string();
            expect_ok(node, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
        }
        for i in 0..masters {
            let lo = (i * SLOTS as usize / masters).to_string();
            let hi = ((i + 1) * SLOTS as usize / masters - 1).to_string();
            expect_ok(&self.nodes[i], &["CLUSTER", "ADDSLOTSRANGE", &lo, &hi]);
        }
        for other in &self.nodes[1..] {
            let port = other.port.to_string();
            let bus = bus_port(other).to_string();
            expect_ok(
                &self.nodes[0],
                &["CLUSTER", "MEET", "127.0.0.1", &port, &bus],
            );
        }
        wait_until(
            &format!("{} cluster nodes to know each other", self.flavor),
            CLUSTER_TIMEOUT,
            || {
                self.nodes.iter().all(|n| {
                    let lines = self.nodes_seen_by(n);
                    lines.len() == self.nodes.len()
                        && lines.iter().all(|l| !l.is_suspect() && l.link_connected)
                })
            },
        );
        let replicas = options.replicas_per_master;
        for m in 0..masters {
            for r in 0..replicas {
                let replica = &self.nodes[masters + m * replicas + r];
                expect_ok(replica, &["CLUSTER", "REPLICATE", &self.ids[m]]);
            }
        }
        self.wait_stable();
    }

    /// Waits until every running node says `cluster_state:ok`, all of them see the same
    /// slot map and the same roles, every running replica's link to its master is up
    /// and it has caught up.
    pub fn wait_stable(&self) {
        wait_until(
            &format!("{} cluster to agree and say cluster_state:ok", self.flavor),
            CLUSTER_TIMEOUT,
            || self.is_stable(),
        );
        for (i, node) in self.running() {
            if let Some(master) = self.master_of(i) {
                wait_until(
                    &format!("{} replica {i} link up", self.flavor),
                    CLUSTER_TIMEOUT,
                    || {
                        node.info_field("replication", "master_link_status")
                            .as_deref()
                            == Some("up")
                    },
                );
                node.wait_for_sync(&self.nodes[master]);
            }
        }
    }

    fn is_stable(&self) -> bool {
        let mut views = Vec::new();
        for (_, node) in self.running() {
            let Some(state) = cluster_info_field(node, "cluster_state") else {
                return false;
            };
            if state != "ok" {
                return false;
            }
            views.push(self.topology_seen_by(node));
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    /// What `node` thinks of the running nodes: (id, master id or None, slot ranges).
    fn topology_seen_by(&self, node: &Server) -> Vec<Seen> {
        let running: Vec<&String> = self.running().map(|(i, _)| &self.ids[i]).collect();
        let mut view: Vec<_> = self
            .nodes_seen_by(node)
            .into_iter()
            .filter(|l| running.contains(&&l.id))
            .map(|l| {
                let master = if l.is_master() {
                    None
                } else {
                    l.master.clone()
                };
                let mut slots = l.slots.clone();
                slots.sort_unstable();
                (l.id, master, slots)
            })
            .collect();
        view.sort();
        view
    }

    /// The running nodes with their index.
    pub fn running(&self) -> impl Iterator<Item = (usize, &Server)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_running())
    }

    /// `CLUSTER NODES` as `node` sees it.
    pub fn nodes_seen_by(&self, node: &Server) -> Vec<NodeLine> {
        let reply = node
            .poll_query(redis::cmd("CLUSTER").arg("NODES"))
            .unwrap_or_else(|e| panic!("CLUSTER NODES on port {}: {e}", node.port));
        parse_nodes(&text(reply))
    }

    fn index_of(&self, id: &str) -> usize {
        self.ids
            .iter()
            .position(|i| i == id)
            .unwrap_or_else(|| panic!("node id {id} is not one of this cluster's"))
    }

    /// A running node to ask about the cluster.
    fn witness(&self) -> &Server {
        self.running()
            .map(|(_, n)| n)
            .next()
            .unwrap_or_else(|| panic!("no node of the {} cluster is running", self.flavor))
    }

    /// The index of the node serving `slot`, as a running node sees it.
    pub fn owner(&self, slot: u16) -> usize {
        let lines = self.nodes_seen_by(self.witness());
        let line = lines
            .iter()
            .find(|l| l.is_master() && l.slots.iter().any(|&(lo, hi)| lo <= slot && slot <= hi))
            .unwrap_or_else(|| panic!("no node serves slot {slot}: {lines:?}"));
        self.index_of(&line.id)
    }

    /// The index of the node serving `key`.
    pub fn owner_of_key(&self, key: &str) -> usize {
        self.owner(key_slot(key.as_bytes()))
    }

    /// The master of replica `i` (per `i`'s own `CLUSTER NODES`), None for a master.
    pub fn master_of(&self, i: usize) -> Option<usize> {
        let lines = self.nodes_seen_by(&self.nodes[i]);
        let me = lines
            .iter()
            .find(|l| l.has_flag("myself"))
            .unwrap_or_else(|| panic!("CLUSTER NODES without myself: {lines:?}"));
        if me.is_master() {
            None
        } else {
            me.master.as_deref().map(|id| self.index_of(id))
        }
    }

    pub fn is_master(&self, i: usize) -> bool {
        self.master_of(i).is_none()
    }

    /// The running replicas of master `m`.
    pub fn replicas_of(&self, m: usize) -> Vec<usize> {
        self.running()
            .map(|(i, _)| i)
            .filter(|&i| i != m && self.master_of(i) == Some(m))
            .collect()
    }

    /// A running replica of master `m`; panics when it has none.
    pub fn replica_of(&self, m: usize) -> usize {
        self.replicas_of(m)
            .first()
            .copied()
            .unwrap_or_else(|| panic!("master {m} has no running replica"))
    }

    /// The slot ranges node `i` serves.
    pub fn slots_of(&self, i: usize) -> Vec<(u16, u16)> {
        self.nodes_seen_by(self.witness())
            .into_iter()
            .find(|l| l.id == self.ids[i])
            .map(|l| l.slots)
            .unwrap_or_default()
    }

    /// `prefix{tag}`: a key name whose slot node `i` serves (tags are tried in order
    /// `0`, `1`, ..., skipping `avoid` slots), so related keys can share the tag.
    pub fn tag_on(&self, i: usize, avoid: &[u16]) -> String {
        let ranges = self.slots_of(i);
        (0..100_000)
            .map(|n| format!("{{t{n}}}"))
            .find(|tag| {
                let slot = key_slot(tag.as_bytes());
                !avoid.contains(&slot) && ranges.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
            })
            .unwrap_or_else(|| panic!("no hash tag for node {i} ({ranges:?})"))
    }

    /// Seed URLs of the running nodes.
    pub fn urls(&self) -> Vec<String> {
        self.running().map(|(_, n)| n.url()).collect()
    }

    /// A cluster client (the `redis` crate's), seeded with every running node.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let client = redis::cluster::ClusterClientBuilder::new(self.urls())
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_else(|e| panic!("{} cluster client: {e}", self.flavor));
        client
            .get_connection()
            .unwrap_or_else(|e| panic!("{} cluster client connection: {e}", self.flavor))
    }

    /// Moves `slot` from its owner to node `to` the way `redis-cli --cluster reshard`
    /// does: IMPORTING on `to`, MIGRATING on the owner, `MIGRATE ... KEYS` in batches
    /// (DUMP on the source, RESTORE-ASKING on `to`), then `SETSLOT NODE` on `to`, the
    /// source and every other master. `before_close` runs while the slot is still
    /// migrating and its keys have moved (for ASK checks). Returns the keys moved: those
    /// in the slot when it starts, since a batch can carry more keys than it names (the
    /// module adds a session's whole group), which later batches then do not list.
    pub fn migrate_slot<F: FnOnce(&Cluster, usize, usize)>(
        &self,
        slot: u16,
        to: usize,
        before_close: F,
    ) -> Vec<String> {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let s = slot.to_string();
        expect_ok(
            &self.nodes[to],
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &self.ids[from]],
        );
        expect_ok(
            &self.nodes[from],
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &self.ids[to]],
        );
        let port = self.nodes[to].port.to_string();
        let count = match query(&self.nodes[from], &["CLUSTER", "COUNTKEYSINSLOT", &s]) {
            Value::Int(n) => n.to_string(),
            other => panic!("CLUSTER COUNTKEYSINSLOT answered {other:?}"),
        };
        let moved: Vec<String> =
            match query(&self.nodes[from], &["CLUSTER", "GETKEYSINSLOT", &s, &count]) {
                Value::Array(keys) => keys.into_iter().map(text).collect(),
                other => panic!("CLUSTER GETKEYSINSLOT answered {other:?}"),
            };
        loop {
            let keys: Vec<String> =
                match query(&self.nodes[from], &["CLUSTER", "GETKEYSINSLOT", &s, "100"]) {
                    Value::Array(keys) => keys.into_iter().map(text).collect(),
                    other => panic!("CLUSTER GETKEYSINSLOT answered {other:?}"),
                };
            if keys.is_empty() {
                break;
            }
            let mut args: Vec<&str> = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            expect_ok(&self.nodes[from], &args);
        }
        before_close(self, from, to);
        let to_id = self.ids[to].clone();
        let setslot = ["CLUSTER", "SETSLOT", &s, "NODE", &to_id];
        expect_ok(&self.nodes[to], &setslot);
        expect_ok(&self.nodes[from], &setslot);
        for (i, node) in self.running() {
            if i != to && i != from && self.is_master(i) {
                expect_ok(node, &setslot);
            }
        }
        wait_until(
            &format!(
                "{} nodes to agree that node {to} serves slot {slot}",
                self.flavor
            ),
            CLUSTER_TIMEOUT,
            || {
                self.running().all(|(_, n)| {
                    self.nodes_seen_by(n).iter().any(|l| {
                        l.id == to_id && l.slots.iter().any(|&(lo, hi)| lo <= slot && slot <= hi)
                    })
                })
            },
        );
        self.wait_stable();
        moved
    }

    /// `CLUSTER FAILOVER [mode]` on replica `replica`; returns once it is a master
    /// (by its own INFO and by every running node's slot map) and the cluster is stable.
    pub fn failover(&self, replica: usize, mode: Option<&str>) {
        let old = self.begin_failover(replica, mode);
        self.finish_failover(replica, old);
    }

    /// Sends `CLUSTER FAILOVER [mode]` to replica `replica`; returns its master's index.
    /// Several shards can fail over at once: begin each, then finish each.
    pub fn begin_failover(&self, replica: usize, mode: Option<&str>) -> usize {
        let old = self
            .master_of(replica)
            .unwrap_or_else(|| panic!("node {replica} is not a replica"));
        let mut args = vec!["CLUSTER", "FAILOVER"];
        args.extend(mode);
        expect_ok(&self.nodes[replica], &args);
        old
    }

    /// Waits until `replica` is a master (by its own INFO), every running node sees it
    /// serve slots and `old` serve none, and the cluster is stable.
    pub fn finish_failover(&self, replica: usize, old: usize) {
        let node = &self.nodes[replica];
        wait_until(
            &format!("{} node {replica} to become master", self.flavor),
            CLUSTER_TIMEOUT,
            || node.info_field("replication", "role").as_deref() == Some("master"),
        );
        let id = &self.ids[replica];
        let old_id = &self.ids[old];
        wait_until(
            &format!(
                "{} nodes to see node {replica} serve the slots of node {old}",
                self.flavor
            ),
            CLUSTER_TIMEOUT,
            || {
                self.running().all(|(_, n)| {
                    let lines = self.nodes_seen_by(n);
                    lines.iter().any(|l| &l.id == id && !l.slots.is_empty())
                        && lines.iter().all(|l| &l.id != old_id || l.slots.is_empty())
                })
            },
        );
        self.wait_stable();
    }
}

fn node_options(extra: &ServerOptions) -> ServerOptions {
    let node_timeout = NODE_TIMEOUT_MS.to_string();
    // The bus port defaults to port + 10000, which overflows for ephemeral ports.
    let bus = free_port().to_string();
    let mut options = extra.clone();
    for (name, value) in [
        ("cluster-enabled", "yes"),
        ("cluster-config-file", "nodes.conf"),
        ("cluster-node-timeout", node_timeout.as_str()),
        ("cluster-port", bus.as_str()),
        ("cluster-replica-no-failover", "yes"),
        ("cluster-allow-replica-migration", "no"),
    ] {
        options = options.config(name, value);
    }
    options
}

fn bus_port(node: &Server) -> u16 {
    let reply = match query(node, &["CONFIG", "GET", "cluster-port"]) {
        Value::Array(mut pair) if pair.len() == 2 => text(pair.remove(1)),
        other => panic!("CONFIG GET cluster-port answered {other:?}"),
    };
    reply
        .parse()
        .unwrap_or_else(|e| panic!("cluster-port {reply:?}: {e}"))
}

fn cluster_info_field(node: &Server, field: &str) -> Option<String> {
    info_field(&text(query(node, &["CLUSTER", "INFO"])), field)
}

/// One command on a new RESP2 connection to `node` (with the harness's read timeout);
/// a connection failure panics, a server error is returned as `Value::ServerError`.
pub fn query(node: &Server, args: &[&str]) -> Value {
    let mut con: Connection = node
        .control()
        .unwrap_or_else(|e| panic!("cannot connect to port {}: {e}", node.port));
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    con.req_command(&cmd)
        .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", node.port))
}

fn expect_ok(node: &Server, args: &[&str]) {
    assert_ok(
        query(node, args),
        &format!("{args:?} on port {}", node.port),
    );
}

/// How many keys `node` holds in each slot it has keys in (from `KEYS *`).
pub fn keys_by_slot(node: &Server) -> BTreeMap<u16, usize> {
    let mut by_slot = BTreeMap::new();
    let mut con = node.client();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut con)
        .unwrap_or_else(|e| panic!("KEYS * on port {}: {e}", node.port));
    for key in keys {
        *by_slot.entry(key_slot(key.as_bytes())).or_insert(0) += 1;
    }
    by_slot
}

/// Moves `slot` from its owner to node `to` by Valkey 9's atomic slot migration
/// (`CLUSTER MIGRATESLOTS SLOTSRANGE slot slot NODE <id>`); returns once the source
/// reports it done, failing on a refusal, a failed or cancelled migration, or 20 s.
pub fn migrate_slot_atomically(cluster: &Cluster, slot: u16, to: usize) {
    let source = &cluster.nodes[cluster.owner(slot)];
    let reply = call(
        &mut source.client(),
        "CLUSTER",
        (
            "MIGRATESLOTS",
            "SLOTSRANGE",
            slot,
            slot,
            "NODE",
            &cluster.ids[to],
        ),
    );
    if let Value::ServerError(e) = &reply {
        panic!("MIGRATESLOTS refused: {e:?}");
    }
    wait_until("the migration to end", Duration::from_secs(20), || {
        let (state, message) = migration_state(source);
        assert!(
            !matches!(state.as_str(), "failed" | "cancelled"),
            "the migration {state}: {message}"
        );
        state == "success"
    });
}

/// The state and message of the last migration `CLUSTER GETSLOTMIGRATIONS` lists on
/// `node` (Valkey 9's atomic slot migration); empty strings when there is none.
fn migration_state(node: &Server) -> (String, String) {
    let reply = call(&mut node.client(), "CLUSTER", "GETSLOTMIGRATIONS");
    let Value::Array(jobs) = reply else {
        panic!("CLUSTER GETSLOTMIGRATIONS: {reply:?}");
    };
    let Some(last) = jobs.last() else {
        return (String::new(), String::new());
    };
    let fields = pairs(last, "a migration entry");
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| match v {
                Value::Nil => String::new(),
                v => text(v.clone()),
            })
            .unwrap_or_default()
    };
    (field("state"), field("message"))
}
